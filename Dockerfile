# CUDA PyTorch runtime image with fxcache; for `container:` jobs with `--gpus all`.
# The toolkit lives in its own venv so it never touches the image's torch environment.
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

ENV FXCACHE_PYTHON=/opt/conda/bin/python \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/fxcache-src
COPY pyproject.toml README.md ./
COPY ci_fxcache ./ci_fxcache
RUN python -m venv /opt/fxcache \
    && /opt/fxcache/bin/pip install --no-cache-dir . \
    && ln -s /opt/fxcache/bin/fxcache /usr/local/bin/fxcache

WORKDIR /workspace
ENTRYPOINT ["fxcache"]
CMD ["--help"]

# CUDA PyTorch runtime image with fxcache; for `container:` jobs with `--gpus all`.
# The toolkit lives in its own venv so it never touches the image's torch environment.
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

# The toolkit's path: pass it to the action as `toolkit: /opt/fxcache/bin/fxcache` to use it
# instead of installing one (the action reads only its input, never FXCACHE_TOOLKIT).
ENV FXCACHE_PYTHON=/opt/conda/bin/python \
    FXCACHE_TOOLKIT=/opt/fxcache/bin/fxcache \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/fxcache-src
COPY pyproject.toml README.md ./
COPY toolkit/requirements.txt toolkit/requirements-redis.txt ./toolkit/
COPY ci_fxcache ./ci_fxcache
RUN python -m venv /opt/fxcache \
    && /opt/fxcache/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: \
        -r toolkit/requirements.txt -r toolkit/requirements-redis.txt \
    && /opt/fxcache/bin/pip install --no-cache-dir --no-deps . \
    && ln -s /opt/fxcache/bin/fxcache /usr/local/bin/fxcache

WORKDIR /workspace
ENTRYPOINT ["fxcache"]
CMD ["--help"]

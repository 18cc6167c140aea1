# Runs in the TARGET interpreter with `python -c`: imports torch and reports what it says
# about itself, so `fxcache fingerprint --probe` can cross-check the no-import fingerprint.
import json
import warnings

warnings.filterwarnings("ignore")
import torch

out: "dict[str, object]" = {
    "torch_version": torch.__version__,
    "torch_git_version": torch.version.git_version,
    "cuda_version": torch.version.cuda,
    "hip_version": torch.version.hip,
    "triton_version": None,
    "cpu_isa": None,
}
gpus = []
try:
    import triton

    out["triton_version"] = triton.__version__
except Exception:
    pass
if torch.cuda.is_available():
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        major, minor = torch.cuda.get_device_capability(index)
        gcn = getattr(props, "gcnArchName", None) if torch.version.hip else None
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "capability": "%d.%d" % (major, minor),
                "arch": gcn.split(":")[0] if gcn else "sm%d%d" % (major, minor),
            }
        )
out["gpus"] = gpus
try:
    from torch._inductor import cpu_vec_isa

    isa_names = {
        "VecAMX": "amx",
        "VecAVX512": "avx512",
        "VecAVX2": "avx2",
        "VecNEON": "asimd",
        "VecSVE256": "sve256",
        "VecVSX": "vsx",
        "VecZVECTOR": "zvector",
    }
    out["cpu_isa"] = isa_names.get(type(cpu_vec_isa.pick_vec_isa()).__name__, "default")
except Exception:
    pass
print(json.dumps(out))

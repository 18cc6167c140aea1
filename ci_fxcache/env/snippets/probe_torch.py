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
    "cpu_isa_class": None,
    "cpu_isa_bits": None,
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
                # on AMD the full target torch's FX graph key holds (gfx90a:sramecc+:xnack-)
                "capability": gcn if gcn else "%d.%d" % (major, minor),
                "arch": gcn.split(":")[0] if gcn else "sm%d%d" % (major, minor),
            }
        )
out["gpus"] = gpus
try:
    from torch._inductor import cpu_vec_isa

    # The class Inductor picked (and its width: SVE comes in 128 and 256 bits); the
    # orchestrator names it (ci_fxcache.env.cpu.from_inductor_class), so the names live in one
    # place.
    picked = cpu_vec_isa.pick_vec_isa()
    out["cpu_isa_class"] = type(picked).__name__
    out["cpu_isa_bits"] = picked.bit_width() if picked else None
except Exception:
    pass
print(json.dumps(out))

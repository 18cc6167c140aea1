# Runs in a process of its own with `python -c`: stdlib only, never imports torch. Asks the
# CUDA driver (libcuda.so.1, found by the dynamic loader: LD_LIBRARY_PATH, ld.so.cache) for
# the devices this process sees; the driver applies CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
# itself. Prints one JSON object: {"library", "error", "driver_api", "devices": [...]}.
# A process of its own because cuInit must not run in the orchestrator, which forks workers.
import ctypes
import json

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
devices: "list[dict[str, object]]" = []
out: "dict[str, object]" = {"library": None, "error": None, "driver_api": None, "devices": devices}


def loaded_path(name):
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if path.rsplit("/", 1)[-1].startswith(name):
                    return path
    except OSError:
        pass
    return name


def call(fn, *args):
    rc = fn(*args)
    if rc != 0:
        raise RuntimeError("%s returned CUDA error %d" % (fn.__name__, rc))


try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    out["error"] = "cannot load libcuda.so.1: %s" % exc
else:
    out["library"] = loaded_path("libcuda.so")
    try:
        call(cuda.cuInit, 0)
        version = ctypes.c_int()
        if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            out["driver_api"] = "%d.%d" % (version.value // 1000, version.value % 1000 // 10)
        count = ctypes.c_int()
        call(cuda.cuDeviceGetCount, ctypes.byref(count))
        for ordinal in range(count.value):
            device = ctypes.c_int()
            call(cuda.cuDeviceGet, ctypes.byref(device), ordinal)
            name = ctypes.create_string_buffer(256)
            call(cuda.cuDeviceGetName, name, len(name), device)
            major, minor = ctypes.c_int(), ctypes.c_int()
            major_attr = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
            minor_attr = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
            call(cuda.cuDeviceGetAttribute, ctypes.byref(major), major_attr, device)
            call(cuda.cuDeviceGetAttribute, ctypes.byref(minor), minor_attr, device)
            devices.append(
                {
                    "index": ordinal,
                    "name": name.value.decode("utf-8", "replace"),
                    "capability": "%d.%d" % (major.value, minor.value),
                }
            )
    except (RuntimeError, AttributeError) as exc:
        out["error"] = str(exc)
        del devices[:]
print(json.dumps(out))

/* Stand-in for the CUDA driver (libcuda.so.1), built by tests/test_gpu_driver.py with the
 * host's C compiler. It answers the calls fxcache makes with devices described by
 * STUB_CUDA_DEVICES ("name|major|minor;name|major|minor", in the driver's own order: a real
 * driver has already applied CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, so this one ignores
 * them). STUB_CUDA_INIT=N makes cuInit return CUDA error N (100: no device). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 16

static char names[MAX_DEVICES][256];
static int majors[MAX_DEVICES], minors[MAX_DEVICES], count = -1;

static void load(void) {
    const char *spec = getenv("STUB_CUDA_DEVICES");
    char copy[4096], *device, *save = NULL;
    count = 0;
    if (spec == NULL) return;
    strncpy(copy, spec, sizeof copy - 1);
    copy[sizeof copy - 1] = '\0';
    for (device = strtok_r(copy, ";", &save); device && count < MAX_DEVICES;
         device = strtok_r(NULL, ";", &save)) {
        char *bar = strchr(device, '|');
        if (bar == NULL) continue;
        *bar = '\0';
        snprintf(names[count], sizeof names[count], "%s", device);
        if (sscanf(bar + 1, "%d|%d", &majors[count], &minors[count]) != 2) continue;
        count++;
    }
}

int cuInit(unsigned int flags) {
    const char *rc = getenv("STUB_CUDA_INIT");
    (void)flags;
    load();
    return rc ? atoi(rc) : 0;
}

int cuDriverGetVersion(int *version) {
    *version = 12080;
    return 0;
}

int cuDeviceGetCount(int *n) {
    if (count < 0) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    *n = count;
    return 0;
}

int cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal >= count) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = ordinal;
    return 0;
}

int cuDeviceGetName(char *name, int len, int device) {
    if (device < 0 || device >= count) return 101;
    snprintf(name, (size_t)len, "%s", names[device]);
    return 0;
}

int cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (device < 0 || device >= count) return 101;
    if (attribute == 75) *value = majors[device];      /* COMPUTE_CAPABILITY_MAJOR */
    else if (attribute == 76) *value = minors[device]; /* COMPUTE_CAPABILITY_MINOR */
    else return 1;                                     /* CUDA_ERROR_INVALID_VALUE */
    return 0;
}

/*
 * A stand-in for the NVIDIA driver library (libcuda.so.1) on machines that have no GPU driver.
 *
 * libmooncake_store.so from the tokenspeed-mooncake wheel is a CUDA build: it links libcuda.so.1
 * and will not load without it. With the `tcp` protocol and host memory it never needs a GPU, so
 * every driver entry point here answers CUDA_ERROR_NO_DEVICE (100). The list is what
 * `nm -D --undefined-only libmooncake_store.so | grep ' cu[A-Z]'` prints for the pinned wheel.
 *
 * tests/cluster/cluster.sh builds this only where no real libcuda.so.1 exists, into its own cache
 * directory, and puts it on LD_LIBRARY_PATH for the test cluster only. Never install it system-wide.
 */
#include <stddef.h>

#define CUDA_ERROR_NO_DEVICE 100
#define NO_DEVICE(name) \
    int name(void) { return CUDA_ERROR_NO_DEVICE; }

NO_DEVICE(cuCtxGetDevice)
NO_DEVICE(cuCtxSetCurrent)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDevicePrimaryCtxRelease_v2)
NO_DEVICE(cuDevicePrimaryCtxRetain)
NO_DEVICE(cuInit)
NO_DEVICE(cuMemAddressFree)
NO_DEVICE(cuMemAddressReserve)
NO_DEVICE(cuMemCreate)
NO_DEVICE(cuMemExportToShareableHandle)
NO_DEVICE(cuMemGetAddressRange_v2)
NO_DEVICE(cuMemGetAllocationGranularity)
NO_DEVICE(cuMemGetHandleForAddressRange)
NO_DEVICE(cuMemImportFromShareableHandle)
NO_DEVICE(cuMemMap)
NO_DEVICE(cuMemRelease)
NO_DEVICE(cuMemRetainAllocationHandle)
NO_DEVICE(cuMemSetAccess)
NO_DEVICE(cuMemUnmap)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuPointerSetAttribute)

/* The two error-text functions write a string through their second argument. */
static const char no_device_name[] = "CUDA_ERROR_NO_DEVICE";
static const char no_device_text[] = "no CUDA-capable device (jitship test stub of libcuda.so.1)";

int cuGetErrorName(int error, const char **out) {
    (void)error;
    if (out != NULL) *out = no_device_name;
    return 0;
}

int cuGetErrorString(int error, const char **out) {
    (void)error;
    if (out != NULL) *out = no_device_text;
    return 0;
}

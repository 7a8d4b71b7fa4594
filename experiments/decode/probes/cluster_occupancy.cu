// How many thread-block clusters of each size an H100 holds at once, for CTAs of the decode kernels' footprint
// (128 threads, SMEM bytes of dynamic shared memory): cudaOccupancyMaxActiveClusters, and what a launch of 64 x
// size CTAs (every CTA spinning 50 us, recording its start) actually runs in its first wave.
//   nvcc -O2 -arch=sm_90 cluster_occupancy.cu -o occ && ./occ 103424 && ./occ 150000
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void spin(unsigned long long* start, long long ns) {
    extern __shared__ char pad[];
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (threadIdx.x == 0) {
        start[blockIdx.x] = t0;
        pad[0] = 1;
    }
    unsigned long long t = t0;
    while (t - t0 < static_cast<unsigned long long>(ns)) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

int main(int argc, char** argv) {
    const int smem = argc > 1 ? atoi(argv[1]) : 103424;
    cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(spin, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int per_sm = 0, sms = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, spin, 128, smem);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    printf("smem %d: %d CTAs/SM, %d SMs, %d resident CTAs\n", smem, per_sm, sms, per_sm * sms);
    unsigned long long* d;
    cudaMalloc(&d, 4096 * 8);
    for (int size = 1; size <= 16; ++size) {
        cudaLaunchConfig_t cfg = {};
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = size;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        cfg.gridDim = dim3(size);
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, spin, &cfg);
        // the launch: as many CTAs as resident slots allow, rounded down to whole clusters
        const int ctas = (per_sm * sms) / size * size;
        cfg.gridDim = dim3(ctas);
        cudaLaunchKernelEx(&cfg, spin, d, 50000LL);
        cudaError_t le = cudaDeviceSynchronize();
        unsigned long long h[4096];
        cudaMemcpy(h, d, ctas * 8, cudaMemcpyDeviceToHost);
        unsigned long long t0 = ~0ull;
        for (int i = 0; i < ctas; ++i) t0 = h[i] < t0 ? h[i] : t0;
        int first = 0;
        for (int i = 0; i < ctas; ++i) first += h[i] - t0 < 25000;
        printf("cluster %2d: max active clusters %3d (%s) -> %3d CTAs; launch of %3d CTAs (%s): %3d started in the first wave\n",
               size, n, cudaGetErrorString(e), n * size, ctas, cudaGetErrorString(le), first);
    }
    return 0;
}

// TMA weight-streaming GEMV for decode: y[b, n] = sum_k x[b, k] * W[n, k]  (+ r[b, n])
//   or, with the SwiGLU epilogue and W = [W_g; W_u] (2N rows):
//   y[b, n] = silu(g) * u,  g = bf16(sum_k x[b, k] W_g[n, k]),  u = bf16(sum_k x[b, k] W_u[n, k])
//
//   and with the RMSNorm prologue, x is replaced by  xn[b, k] = bf16(x[b, k] * rstd[b] * (w[k] + o)),
//   rstd[b] = 1 / sqrt(mean_k x[b, k]^2 + eps), o = 1 for a (1 + w) weight else 0.
//
//   x [B, K] bf16 (B = 1..16, row stride x_stride), W bf16 (row stride w_stride), unit column
//   strides, optional residual r [B, N] bf16; float32 accumulation, one rounding to bf16 at the end
//   (the residual is added in float32 before that rounding).
//
// At decode time every weight byte is read once per token and x is tiny, so the kernel is a weight
// stream: its speed is bytes / bandwidth if enough bytes are in flight (Little's law: ~1 us of HBM
// latency x ~4.5 TB/s is ~4.5 MB for the whole chip, ~35 KB per SM). A plain load holds a register
// per element until its data arrives; the Tensor Memory Accelerator (TMA) instead copies a whole
// [block_n, block_k] box of W into shared memory on one thread's request and signals an mbarrier when
// the bytes have landed, so a block can keep `stages` boxes in flight with no registers held.
//
// Pipeline (one block = 1 producer warp + 4 consumer warps, persistent over work items):
//
//   work item  = (row tile of block_n rows of W, K split); items are spread over the grid
//   stage s    = a [block_n, block_k] box of W and the [B, block_k] box of x at the same
//                columns, in shared memory; s = i mod stages for the block's i-th K tile
//   producer   : lane 0 waits empty[s] (the consumers freed it), arms full[s] with both boxes' byte
//                count (mbarrier.arrive.expect_tx), issues two cp.async.bulk.tensor (TMA) copies into
//                stage s, and moves on: up to `stages` stages in flight. Its first round of W boxes
//                goes out before griddepcontrol.wait (weights depend on nothing; x does), so with
//                programmatic dependent launch the weight stream starts while the previous kernel
//                finishes. x boxes come from L2 (every block reads x; it is small).
//   consumers  : wait full[s] (phase parity), multiply the W box by the x box with tensor cores
//                (mma.sync m16n8k16, W rows as the M side, the batch as N, padded to 8 or 16),
//                then arrive on empty[s]. Warp w owns a 16-row slab of the box and a slice of its
//                columns (4 warps = block_n / 16 slabs x 64 / block_n column slices).
//   item end   : the consumer warps sum their slices through shared memory (a 4 KB scratch) and
//                store y (+ r); with split_k > 1 they store float32 partials [split, B, N] instead,
//                and the last block of the row tile to arrive (an atomic counter, reset by that
//                block) sums the partials in split order and runs the epilogue: deterministic.
//
// The mma fragments read W from shared memory as 16-byte vectors: lane (g = lane / 4, t = lane % 4)
// loads columns 8t..8t+7 of rows g and g + 8 of a 32-column group. A dot product may visit k in any
// order, so logical k = 2t+{0,1} / 2t+8+{0,1} of the fragment maps to physical columns
// 8t+{0,1} / 8t+{2,3} (first mma) and 8t+{4,5} / 8t+{6,7} (second), the same map for x.
//
// Requirements (the launcher returns an error otherwise): K % 8 == 0 and every base and row stride
// 16-byte aligned (TMA's rule for global addresses and strides: a K that is not a multiple of 8
// bf16 elements gives a row stride that is not); 1 <= B <= 16; block_n in {16, 32, 64};
// block_k in {64, 128, 256} with block_k / (64 / block_n) >= 32.
//
// Built by labkit.cuda (torch.utils.cpp_extension) with a thin binding; compiles with plain nvcc
// (no torch headers): nvcc -c -gencode=arch=compute_90a,code=sm_90a -Xptxas -v kernels/tma_gemv.cu

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <map>
#include <tuple>
#include <utility>

namespace {

constexpr int kConsumerWarps = 4;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kMaxBatch = 16;
constexpr int kScratchFloats = 64 * kMaxBatch;  // [k slices][block_n rows][16]: slices * block_n == 64
constexpr int kMaxStages = 32;

struct Params {
  const __nv_bfloat16* x;         // [B, K], row stride x_stride: read directly only for the norm's statistics
  long long x_stride;
  const __nv_bfloat16* norm_w;    // [K] RMSNorm weight (NORM kernels)
  float norm_eps;
  float norm_offset;              // 1 for a (1 + w) weight, else 0
  const __nv_bfloat16* residual;  // [B, N] contiguous, or null
  __nv_bfloat16* out;             // [B, N] contiguous
  float* partials;                // [split_k, B, R * N] when split_k > 1 (R = 2 with SwiGLU)
  int* counters;                  // [row tiles], zero between launches
  int batch, n, k;
  int block_n, block_k, stages, split_k;
  int k_tiles_per_split;
  int k_tiles;
  int items;  // row tiles * split_k
};

// ---- PTX wrappers ---------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// until the phase with this parity has completed (try_wait suspends the thread for a while)
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  while (!mbar_try_wait(addr, parity)) {
  }
}

// one box of the tensor behind `map` (W or x), at column k0 and row n0, into shared memory; the copy
// engine counts its bytes on `bar` (rows or columns past the tensor arrive as zeros)
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, int k0, int n0, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(n0), "r"(smem_addr(bar))
      : "memory");
}

// programmatic dependent launch: no-ops when the kernel was launched without the attribute
__device__ __forceinline__ void wait_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void release_dependent_grid() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// consumer threads only (the producer warp keeps streaming): named barrier 1
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
}

// d += a (16x16, row) * b (16x8, col), bf16 in, float32 accumulate
__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// RMSNorm prologue: 1 / sqrt(mean_k x[b, k]^2 + eps) for each batch row, into rstd[0..B), by the
// consumer warps (one row per warp at a time, 16-byte loads, a warp reduction)
__device__ __forceinline__ void row_rstd(const Params& p, float* rstd, int warp, int lane) {
  for (int b = warp; b < p.batch; b += kConsumerWarps) {
    const __nv_bfloat16* row = p.x + (long long)b * p.x_stride;
    float sum = 0.f;
    for (int k = 8 * lane; k < p.k; k += 8 * 32) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + k));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]));
        sum += f.x * f.x + f.y * f.y;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) rstd[b] = rsqrtf(sum / p.k + p.norm_eps);
  }
}

// 8 x values of one row (a 16-byte vector) normalised: bf16(x * rstd * (w + offset)), w at column k
__device__ __forceinline__ uint4 normalise8(const Params& p, uint4 v, float rstd, int k) {
  if (k >= p.k) return v;  // past K: x is zero there (TMA's fill), and so stays
  const uint4 wv = __ldg(reinterpret_cast<const uint4*>(p.norm_w + k));
  uint32_t xs[4] = {v.x, v.y, v.z, v.w};
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[q]));
    const float2 wf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ws[q]));
    const __nv_bfloat162 r =
        __floats2bfloat162_rn(xf.x * rstd * (wf.x + p.norm_offset), xf.y * rstd * (wf.y + p.norm_offset));
    xs[q] = *reinterpret_cast<const uint32_t*>(&r);
  }
  return make_uint4(xs[0], xs[1], xs[2], xs[3]);
}

// y for output (b, n) from its float32 sums: + residual, or silu(gate) * up with gate and up rounded
// to bf16 first (as two separate projections would have stored them)
template <bool SWIGLU>
__device__ __forceinline__ float finish(const Params& p, float acc, float up, int b, int n) {
  if (SWIGLU) {
    const float gate = __bfloat162float(__float2bfloat16(acc));
    return gate / (1.f + __expf(-gate)) * __bfloat162float(__float2bfloat16(up));
  }
  if (p.residual != nullptr) acc += __bfloat162float(p.residual[(long long)b * p.n + n]);
  return acc;
}

// ---- kernel ---------------------------------------------------------------------------------------
__device__ __forceinline__ void item_k_range(const Params& p, int item, int& tile, int& split, int& kt0, int& kt1) {
  tile = item / p.split_k;
  split = item % p.split_k;
  kt0 = split * p.k_tiles_per_split;
  kt1 = min(kt0 + p.k_tiles_per_split, p.k_tiles);
}

// NT: batch tiles of 8 (1: B <= 8, 2: B <= 16). The x box has B rows; the stage's rows B..8*NT-1
// hold stale data, which reaches only the mma output columns b >= B, never stored.
// SWIGLU: W is [W_gate; W_up] (2N rows); a stage holds the gate box (rows n0..) and the up box
// (rows N + n0..), both multiplied by the same x box.
// NORM: x is RMS-normalised on the way from the x box to the mma (statistics taken first from x in
// global memory, by every block), rounded to bf16 as a separate norm would have stored it.
template <int NT, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(kThreads, 1)
    tma_gemv_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                    const Params p) {
  constexpr int R = SWIGLU ? 2 : 1;  // row blocks of W per output
  extern __shared__ __align__(128) unsigned char smem[];
  const int w_box = p.block_n * p.block_k * 2;
  const int w_bytes = R * w_box;
  const int stage_bytes = w_bytes + 8 * NT * p.block_k * 2;  // room for x rows up to the batch tile
  const int tx_bytes = w_bytes + p.batch * p.block_k * 2;    // what the copies bring
  float* scratch = reinterpret_cast<float*>(smem + p.stages * stage_bytes);
  float* rstd = scratch + R * kScratchFloats;  // [16]: the norm's per-row scale
  uint64_t* full = reinterpret_cast<uint64_t*>(rstd + kMaxBatch);
  uint64_t* empty = full + p.stages;
  int* last_flag = reinterpret_cast<int*>(empty + p.stages);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);                 // the producer's arrive (+ the boxes' bytes)
      mbar_init(&empty[s], kConsumerWarps);   // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the async proxy
  }
  __syncthreads();
  release_dependent_grid();

  if (warp == kConsumerWarps) {
    // ---- producer: one thread streams W (and the matching columns of x) ----
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w_map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x_map)) : "memory");
      int tile, split, kt0, kt1;
      // first round: the W boxes alone, before waiting for the kernel that writes x
      int ahead = 0;
      for (int item = blockIdx.x; item < p.items && ahead < p.stages; item += gridDim.x) {
        item_k_range(p, item, tile, split, kt0, kt1);
        for (int kt = kt0; kt < kt1 && ahead < p.stages; ++kt, ++ahead) {
          unsigned char* stage = smem + ahead * stage_bytes;
          mbar_arrive_expect_tx(&full[ahead], tx_bytes);
          tma_load_box(stage, &w_map, kt * p.block_k, tile * p.block_n, &full[ahead]);
          if (SWIGLU) tma_load_box(stage + w_box, &w_map, kt * p.block_k, p.n + tile * p.block_n, &full[ahead]);
        }
      }
      wait_previous_grid();
      int i = 0;
      for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        item_k_range(p, item, tile, split, kt0, kt1);
        for (int kt = kt0; kt < kt1; ++kt, ++i) {
          const int s = i % p.stages, round = i / p.stages;
          unsigned char* stage = smem + s * stage_bytes;
          if (i >= ahead) {
            if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
            mbar_arrive_expect_tx(&full[s], tx_bytes);
            tma_load_box(stage, &w_map, kt * p.block_k, tile * p.block_n, &full[s]);
            if (SWIGLU) tma_load_box(stage + w_box, &w_map, kt * p.block_k, p.n + tile * p.block_n, &full[s]);
          }
          tma_load_box(stage + w_bytes, &x_map, kt * p.block_k, 0, &full[s]);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  wait_previous_grid();  // the residual may come from the previous kernel, and out may be its input
  const int slices = 64 / p.block_n;  // column slices per box (4 warps = slabs x slices)
  const int slab = warp / slices, slice = warp % slices;
  const int slice_cols = p.block_k / slices;
  const int g = lane / 4, t = lane % 4;
  const int tid = threadIdx.x;  // 0..127 among consumers
  const int col0 = slice * slice_cols + 8 * t;
  const int rows_w = R * p.n;  // partials per batch row
  float row_scale[NT];  // rstd of batch rows g and g + 8 (NORM)
  if (NORM) {
    row_rstd(p, rstd, warp, lane);
    consumers_sync();
#pragma unroll
    for (int j = 0; j < NT; ++j) row_scale[j] = j * 8 + g < p.batch ? rstd[j * 8 + g] : 0.f;
  }
  int i = 0;
  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
    int tile, split, kt0, kt1;
    item_k_range(p, item, tile, split, kt0, kt1);
    float acc[R][NT][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.f;

    for (int kt = kt0; kt < kt1; ++kt, ++i) {
      const int s = i % p.stages;
      mbar_wait(&full[s], (i / p.stages) & 1);
      const unsigned char* stage = smem + s * stage_bytes;
      const __nv_bfloat16* x_row = reinterpret_cast<const __nv_bfloat16*>(stage + w_bytes) + g * p.block_k + col0;
#pragma unroll 2
      for (int c = 0; c < slice_cols; c += 32) {
        uint4 xb[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          xb[j] = *reinterpret_cast<const uint4*>(x_row + j * 8 * p.block_k + c);
          if (NORM) xb[j] = normalise8(p, xb[j], row_scale[j], kt * p.block_k + col0 + c);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const __nv_bfloat16* row_lo =
              reinterpret_cast<const __nv_bfloat16*>(stage + r * w_box) + (slab * 16 + g) * p.block_k + col0 + c;
          const uint4 a_lo = *reinterpret_cast<const uint4*>(row_lo);
          const uint4 a_hi = *reinterpret_cast<const uint4*>(row_lo + 8 * p.block_k);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma_bf16(acc[r][j], a_lo.x, a_hi.x, a_lo.y, a_hi.y, xb[j].x, xb[j].y);
            mma_bf16(acc[r][j], a_lo.z, a_hi.z, a_lo.w, a_hi.w, xb[j].z, xb[j].w);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }

    // ---- item end: sum the column slices, then store y or a partial ----
    consumers_sync();  // the previous item's epilogue has read the scratch
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int row = slab * 16 + g, b = j * 8 + 2 * t;
        float* dst = scratch + r * kScratchFloats + (slice * p.block_n + row) * kMaxBatch + b;
        dst[0] = acc[r][j][0];
        dst[1] = acc[r][j][1];
        dst[8 * kMaxBatch] = acc[r][j][2];  // row + 8
        dst[8 * kMaxBatch + 1] = acc[r][j][3];
      }
    consumers_sync();
    const int n0 = tile * p.block_n;
    const int outputs = p.block_n * p.batch;
    for (int idx = tid; idx < outputs; idx += kConsumerWarps * 32) {
      const int row = idx % p.block_n, b = idx / p.block_n, n = n0 + row;
      if (n >= p.n) continue;
      float sum[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sum[r] = 0.f;
        for (int sl = 0; sl < slices; ++sl) sum[r] += scratch[r * kScratchFloats + (sl * p.block_n + row) * kMaxBatch + b];
      }
      if (p.split_k == 1) {
        p.out[(long long)b * p.n + n] = __float2bfloat16(finish<SWIGLU>(p, sum[0], sum[R - 1], b, n));
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) p.partials[((long long)split * p.batch + b) * rows_w + r * p.n + n] = sum[r];
      }
    }
    if (p.split_k > 1) {
      __threadfence();  // the partials are visible before the counter says so
      consumers_sync();
      if (tid == 0) {
        const int before = atomicAdd(&p.counters[tile], 1);
        *last_flag = before == p.split_k - 1;
        if (*last_flag) p.counters[tile] = 0;  // every split has arrived: ready for the next launch
      }
      consumers_sync();
      if (*last_flag) {
        __threadfence();
        for (int idx = tid; idx < outputs; idx += kConsumerWarps * 32) {
          const int row = idx % p.block_n, b = idx / p.block_n, n = n0 + row;
          if (n >= p.n) continue;
          float sum[R];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            sum[r] = 0.f;
            for (int sp = 0; sp < p.split_k; ++sp)
              sum[r] += __ldcg(&p.partials[((long long)sp * p.batch + b) * rows_w + r * p.n + n]);
          }
          p.out[(long long)b * p.n + n] = __float2bfloat16(finish<SWIGLU>(p, sum[0], sum[R - 1], b, n));
        }
      }
    }
  }
}

// ---- host side ------------------------------------------------------------------------------------
int fail(char* err, int err_len, const char* msg) {
  if (err != nullptr && err_len > 0) snprintf(err, err_len, "%s", msg);
  return 1;
}

int fail_cuda(char* err, int err_len, const char* what, cudaError_t e) {
  if (err != nullptr && err_len > 0) snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
  cudaGetLastError();  // reported here: not left for the caller's next launch check to find
  return 1;
}

// cuTensorMapEncodeTiled is a driver API function; fetching it through the runtime avoids linking
// libcuda (torch's extension build links only the runtime) and uses the driver the runtime loaded.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
    }
  }
  return fn;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// A 2-D bf16 tensor map: `rows` rows of `cols` elements, `stride` elements apart, read in boxes of
// [box_rows, box_cols]; elements outside the tensor arrive as zeros (and cost no memory traffic).
CUresult encode_2d(CUtensorMap* map, const void* base, long long rows, long long cols, long long stride, int box_rows,
                   int box_cols) {
  const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};  // innermost first
  const cuuint64_t strides[1] = {(cuuint64_t)stride * 2};           // bytes between rows
  const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
  const cuuint32_t unit[2] = {1, 1};
  return tensor_map_encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                              unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

extern "C" {

// Dynamic shared memory of one block: stages (a W box and an x box each), the slice scratch, the
// barriers and a flag.
int labkit_tma_gemv_smem_bytes(int block_n, int block_k, int stages, int batch, int swiglu) {
  const int x_rows = batch <= 8 ? 8 : 16, row_blocks = swiglu ? 2 : 1;
  return stages * (row_blocks * block_n + x_rows) * block_k * 2 + (row_blocks * kScratchFloats + kMaxBatch) * 4 +
         2 * stages * 8 + 16;
}

// y = x W^T (+ residual), or with swiglu (W [2N, K]) silu(x W_gate^T) * (x W_up^T), on `stream`;
// with norm_w (bf16 [K]), x is RMS-normalised first: x * rsqrt(mean(x^2) + eps) * (w + norm_offset).
// Returns 0, or 1 with a message in err. n: outputs per row. partials: [split_k, batch, (1 or 2) n].
// max_blocks: grid cap (0: as many blocks as fit on the device at once).
int labkit_tma_gemv(const void* x, long long x_stride, const void* w, long long w_stride, const void* residual,
                    void* out, float* partials, int* counters, int batch, int n, int k, int swiglu,
                    const void* norm_w, float norm_eps, float norm_offset, int block_n, int block_k, int stages,
                    int split_k, int max_blocks, int pdl, void* stream, char* err, int err_len) {
  if (batch < 1 || batch > kMaxBatch) return fail(err, err_len, "tma_gemv: batch must be 1..16");
  if (n < 1 || k < 1) return fail(err, err_len, "tma_gemv: N and K must be positive");
  if (k % 8) return fail(err, err_len, "tma_gemv: K must be a multiple of 8 (TMA needs 16-byte row strides)");
  if (!aligned16(x) || !aligned16(w) || !aligned16(out) || (residual != nullptr && !aligned16(residual)))
    return fail(err, err_len, "tma_gemv: x, W, out and residual must start 16-byte aligned");
  if (x_stride % 8 || w_stride % 8 || x_stride < k || w_stride < k)
    return fail(err, err_len, "tma_gemv: row strides of x and W must be >= K and multiples of 8 elements (16 bytes)");
  if (block_n != 16 && block_n != 32 && block_n != 64) return fail(err, err_len, "tma_gemv: block_n must be 16, 32 or 64");
  if (block_k != 64 && block_k != 128 && block_k != 256)
    return fail(err, err_len, "tma_gemv: block_k must be 64, 128 or 256");
  if (block_k / (64 / block_n) < 32)
    return fail(err, err_len, "tma_gemv: block_k / (64 / block_n) must be >= 32 (each consumer warp takes >= 32 columns)");
  if (stages < 1 || stages > kMaxStages) return fail(err, err_len, "tma_gemv: stages must be 1..32");
  const int k_tiles = (k + block_k - 1) / block_k;
  if (split_k < 1 || split_k > k_tiles) return fail(err, err_len, "tma_gemv: split_k must be 1..ceil(K / block_k)");
  const int per_split = (k_tiles + split_k - 1) / split_k;
  if ((split_k - 1) * per_split >= k_tiles)
    return fail(err, err_len, "tma_gemv: split_k leaves a split without K tiles; choose a smaller one");
  if (swiglu && residual != nullptr) return fail(err, err_len, "tma_gemv: swiglu has no residual epilogue");
  if (norm_w != nullptr && !aligned16(norm_w)) return fail(err, err_len, "tma_gemv: the norm weight must start 16-byte aligned");
  if (split_k > 1 && (partials == nullptr || counters == nullptr))
    return fail(err, err_len, "tma_gemv: split_k > 1 needs a partials and a counters workspace");

  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return fail(err, err_len, "tma_gemv: the driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
  CUtensorMap w_map, x_map;
  CUresult r = encode_2d(&w_map, w, swiglu ? 2LL * n : n, k, w_stride, block_n, block_k);
  if (r == CUDA_SUCCESS) r = encode_2d(&x_map, x, batch, k, x_stride, batch, block_k);
  if (r != CUDA_SUCCESS) {
    if (err != nullptr && err_len > 0) snprintf(err, err_len, "tma_gemv: cuTensorMapEncodeTiled failed (CUresult %d)", (int)r);
    return 1;
  }

  Params p;
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.x_stride = x_stride;
  p.norm_w = static_cast<const __nv_bfloat16*>(norm_w);
  p.norm_eps = norm_eps;
  p.norm_offset = norm_offset;
  p.residual = static_cast<const __nv_bfloat16*>(residual);
  p.out = static_cast<__nv_bfloat16*>(out);
  p.partials = partials;
  p.counters = counters;
  p.batch = batch;
  p.n = n;
  p.k = k;
  p.block_n = block_n;
  p.block_k = block_k;
  p.stages = stages;
  p.split_k = split_k;
  p.k_tiles = k_tiles;
  p.k_tiles_per_split = per_split;
  p.items = ((n + block_n - 1) / block_n) * split_k;

  // the instantiation: batch tile (8 or 16), epilogue, norm prologue
  using Kernel = void (*)(const CUtensorMap, const CUtensorMap, const Params);
  static const Kernel kernels[8] = {
      tma_gemv_kernel<1, false, false>, tma_gemv_kernel<2, false, false>, tma_gemv_kernel<1, true, false>,
      tma_gemv_kernel<2, true, false>,  tma_gemv_kernel<1, false, true>,  tma_gemv_kernel<2, false, true>,
      tma_gemv_kernel<1, true, true>,   tma_gemv_kernel<2, true, true>};
  const int variant = (batch <= 8 ? 0 : 1) + (swiglu ? 2 : 0) + (norm_w != nullptr ? 4 : 0);
  const Kernel kernel = kernels[variant];
  const int smem = labkit_tma_gemv_smem_bytes(block_n, block_k, stages, batch, swiglu);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return fail_cuda(err, err_len, "tma_gemv: cudaGetDevice", e);
  // Raising the shared-memory limit and asking the occupancy are done once per (device, kernel,
  // size), so that launches captured into a CUDA graph make no such calls.
  static std::map<std::pair<int, int>, int> smem_limit;       // (device, kernel) -> limit set so far
  static std::map<std::tuple<int, int, int>, int> resident;  // (device, kernel, smem) -> blocks per SM
  int& limit = smem_limit[{device, variant}];
  if (smem > limit) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return fail_cuda(err, err_len, "tma_gemv: shared memory limit (too many stages?)", e);
    limit = smem;
  }
  int& per_sm = resident[{device, variant, smem}];
  if (per_sm == 0) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
    if (e != cudaSuccess) return fail_cuda(err, err_len, "tma_gemv: occupancy", e);
    if (per_sm < 1) return fail(err, err_len, "tma_gemv: a block of this configuration does not fit on an SM");
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  int grid = sms * per_sm;
  if (max_blocks > 0 && max_blocks < grid) grid = max_blocks;
  if (grid > p.items) grid = p.items;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  e = cudaLaunchKernelEx(&cfg, kernel, w_map, x_map, p);
  if (e != cudaSuccess) return fail_cuda(err, err_len, "tma_gemv: launch", e);
  return 0;
}

}  // extern "C"

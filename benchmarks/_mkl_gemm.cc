// An XLA FFI handler for `jax_mkl_dots.py`: a row-major (batched) fp32
// GEMM on MKL's `sgemm` / `sgemm_batch` (the MKL inside PyTorch's CPU
// wheel; `jax_mkl_dots.py` passes the function pointers in).
//
// The work is split into chunks (batch entries, rows or columns of the
// output) that XLA's own intra-op threads take through the FFI thread
// pool, MKL single-threaded in each; the calling thread takes chunks too
// and runs every chunk no helper has started, so a busy pool costs speed,
// never a deadlock. (An OpenMP team of MKL's own beside XLA's threads, or
// a spinning helper thread, made the gradient step 1.25-1.3x slower:
// benchmarks/README.md, forty-seventh session.)
//
// Built by `jax_mkl_dots.py` with the system C++ compiler against
// `jax.ffi.include_dir()`. Benchmark code, not part of the library.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Fortran BLAS conventions (column-major, every argument a pointer).
using Sgemm = void (*)(const char*, const char*, const int*, const int*,
                       const int*, const float*, const float*, const int*,
                       const float*, const int*, const float*, float*,
                       const int*);
using SgemmBatch = void (*)(const char*, const char*, const int*, const int*,
                            const int*, const float*, const float**,
                            const int*, const float**, const int*,
                            const float*, float**, const int*, const int*,
                            const int*);
using SetThreadsLocal = int (*)(const int*);

Sgemm sgemm = nullptr;
SgemmBatch sgemm_batch = nullptr;
SetThreadsLocal set_threads_local = nullptr;
int chunks_per_thread = 2;
std::atomic<long long> handler_ns{0}, calls{0}, chunks{0}, caller_chunks{0};
// Wall time with at least one call running (overlapping calls once).
std::atomic<int> active{0};
std::atomic<long long> busy_since{0}, busy_ns{0};

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Gemm {
  const float* a;
  const float* b;
  float* c;
  int64_t batch, m, n, k;
  bool ta, tb;
  int parts;
  int split;  // 0: batch entries, 1: rows of C, 2: columns of C
  std::atomic<int> next{0};
  std::atomic<int> done{0};

  // Row-major C(m, n) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  void run(int part) const {
    static thread_local bool single = false;
    if (!single && set_threads_local != nullptr) {
      const int one_thread = 1;
      set_threads_local(&one_thread);
      single = true;
    }
    const float one = 1.0f, zero = 0.0f;
    const char op_b = tb ? 'T' : 'N', op_a = ta ? 'T' : 'N';
    const int ldb = tb ? k : n, lda = ta ? m : k, ldc = n;
    if (split == 0) {
      const int64_t first = batch * part / parts;
      const int size = static_cast<int>(batch * (part + 1) / parts - first);
      const int rows = m, cols = n, depth = k, group = 1;
      std::vector<const float*> pa(size), pb(size);
      std::vector<float*> pc(size);
      for (int i = 0; i < size; ++i) {
        pa[i] = a + (first + i) * m * k;
        pb[i] = b + (first + i) * k * n;
        pc[i] = c + (first + i) * m * n;
      }
      if (size > 0) {
        sgemm_batch(&op_b, &op_a, &cols, &rows, &depth, &one, pb.data(), &ldb,
                    pa.data(), &lda, &zero, pc.data(), &ldc, &group, &size);
      }
    } else if (split == 1) {
      const int64_t first = m * part / parts;
      const int rows = static_cast<int>(m * (part + 1) / parts - first);
      const int cols = n, depth = k;
      const float* a_part = ta ? a + first : a + first * k;
      if (rows > 0) {
        sgemm(&op_b, &op_a, &cols, &rows, &depth, &one, b, &ldb, a_part, &lda,
              &zero, c + first * n, &ldc);
      }
    } else {
      const int64_t first = n * part / parts;
      const int cols = static_cast<int>(n * (part + 1) / parts - first);
      const int rows = m, depth = k;
      const float* b_part = tb ? b + first * k : b + first;
      if (cols > 0) {
        sgemm(&op_b, &op_a, &cols, &rows, &depth, &one, b_part, &ldb, a, &lda,
              &zero, c + first, &ldc);
      }
    }
  }

  // Runs chunks until none is left; returns how many this thread ran.
  int work() {
    int ran = 0;
    for (int part; (part = next.fetch_add(1)) < parts; ++ran) {
      run(part);
      done.fetch_add(1, std::memory_order_release);
    }
    return ran;
  }
};

ffi::Error GemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a,
                    ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> c,
                    int64_t batch, int64_t m, int64_t n, int64_t k, int64_t ta,
                    int64_t tb) {
  if (sgemm == nullptr || sgemm_batch == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "mkl_gemm: set_blas was not called");
  }
  const auto start = std::chrono::steady_clock::now();
  if (active.fetch_add(1) == 0) busy_since = now_ns();
  auto gemm = std::make_shared<Gemm>();
  gemm->a = a.typed_data();
  gemm->b = b.typed_data();
  gemm->c = c->typed_data();
  gemm->batch = batch;
  gemm->m = m;
  gemm->n = n;
  gemm->k = k;
  gemm->ta = ta != 0;
  gemm->tb = tb != 0;
  const int threads = std::max<int64_t>(1, pool.num_threads());
  int parts = threads * chunks_per_thread;
  if (batch > 1) {
    gemm->split = 0;
    parts = std::min<int64_t>(parts, batch);
  } else {
    gemm->split = m >= n ? 1 : 2;
    // At least 16 rows or columns a chunk.
    parts = std::max<int64_t>(1, std::min<int64_t>(parts, std::max(m, n) / 16));
  }
  if (2.0 * batch * m * n * k < 2e6) parts = 1;  // too small to share
  gemm->parts = parts;
  const int helpers = std::min(threads, parts) - 1;
  for (int i = 0; i < helpers; ++i) pool.Schedule([gemm]() { gemm->work(); });
  caller_chunks += gemm->work();
  while (gemm->done.load(std::memory_order_acquire) < parts) {
    std::this_thread::yield();
  }
  chunks += parts;
  calls += 1;
  {
    const long long since = busy_since.load();
    if (active.fetch_sub(1) == 1) busy_ns += now_ns() - since;
  }
  handler_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  return ffi::Error::Success();
}

}  // namespace

extern "C" {
void set_blas(void* gemm, void* gemm_batch, void* threads_local, int chunks) {
  sgemm = reinterpret_cast<Sgemm>(gemm);
  sgemm_batch = reinterpret_cast<SgemmBatch>(gemm_batch);
  set_threads_local = reinterpret_cast<SetThreadsLocal>(threads_local);
  chunks_per_thread = std::max(1, chunks);
}
// Totals since the start: nanoseconds inside the handler (summed over
// calls), wall nanoseconds with a call running, calls, chunks, and chunks
// the calling thread ran itself.
long long mkl_handler_ns() { return handler_ns.load(); }
long long mkl_busy_ns() { return busy_ns.load(); }
long long mkl_calls() { return calls.load(); }
long long mkl_chunks() { return chunks.load(); }
long long mkl_caller_chunks() { return caller_chunks.load(); }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(MklGemm, GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("batch")
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("ta")
                                  .Attr<int64_t>("tb"));

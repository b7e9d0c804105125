// The kernels' thread pool.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common.h"

#if defined(__x86_64__) || defined(__i386__)
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() { std::this_thread::yield(); }
#endif

// A tiny thread pool. A job's chunks are split in one contiguous range per
// thread; each thread claims chunks from the front of its own range with a
// compare-and-swap (so it streams through memory), then steals from the others'
// ranges. The caller works too and, once no chunk is left, waits only for chunks
// that other threads have already started: a helper that is slow to wake (busy
// or oversubscribed cores) never stalls a call, the caller does its share.
// (OpenMP's static split waits for every thread at the end of each region.)

namespace {
const int MAX_THREADS = 64;
struct alignas(64) Cursor {
  std::atomic<uint64_t> v{0};  // job generation << 32 | next chunk of this range
};
struct Job {  // one slot per generation parity, rewritten only after that job ended
  std::atomic<chunk_fn> fn{nullptr};
  std::atomic<const void *> ctx{nullptr};
  std::atomic<int64_t> nchunks{0};
  std::atomic<int> nranges{1};
};
struct Pool {
  alignas(64) std::atomic<uint32_t> gen{0};
  alignas(64) std::atomic<int64_t> done{0};  // chunks finished in the current job
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> busy{false};             // one caller at a time; others run alone
  Cursor cur[MAX_THREADS];
  Job jobs[2];
  std::mutex mu;                             // only for sleeping and starting threads
  std::condition_variable cv;
  int started = 0;
  int used = 0;  // cursors used so far; written only by the caller holding busy
};
Pool &pool = *new Pool;  // never destroyed: helpers may still wait on it at exit

// Run chunks of job generation g, own range first, until none is left.
void work(uint32_t g, int id) {
  const Job &job = pool.jobs[g & 1];
  int nr = job.nranges.load(std::memory_order_relaxed);
  nr = nr < 1 ? 1 : nr > MAX_THREADS ? MAX_THREADS : nr;  // a stale job's value only fails claims
  int64_t mine = 0;
  for (int k = 0; k < nr; k++) {
    const int r = (id + k) % nr;
    std::atomic<uint64_t> &cur = pool.cur[r].v;
    uint64_t s = cur.load(std::memory_order_acquire);
    while ((uint32_t)(s >> 32) == g) {
      const int64_t c = (int64_t)(uint32_t)s, n = job.nchunks.load(std::memory_order_relaxed);
      if (c >= (r + 1) * n / nr) break;
      if (cur.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        // success proves job g was still running, so the slot holds its fn and ctx
        job.fn.load(std::memory_order_relaxed)(job.ctx.load(std::memory_order_relaxed), c);
        mine++;
        s = cur.load(std::memory_order_acquire);
      }
    }
  }
  if (mine) pool.done.fetch_add(mine, std::memory_order_release);
}

void helper(int id) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = pool.gen.load(std::memory_order_acquire);
    for (int i = 0; i < 4000 && g == seen; i++) {  // spin ~0.1 ms: catches back-to-back calls
      cpu_relax();
      g = pool.gen.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(pool.mu);
      pool.sleepers.fetch_add(1, std::memory_order_seq_cst);
      while ((g = pool.gen.load(std::memory_order_seq_cst)) == seen) pool.cv.wait(lk);
      pool.sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = g;
    work(g, id);
  }
}
}  // namespace

void run_chunks(chunk_fn fn, const void *ctx, int64_t nchunks, int nth) {
  int nr = nth < nchunks ? nth : (int)nchunks;
  if (nr > MAX_THREADS) nr = MAX_THREADS;
  if (nr < 2 || nchunks >= (1LL << 31) || pool.busy.exchange(true, std::memory_order_acquire)) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    return;
  }
  if (pool.started < nr - 1) {
    std::lock_guard<std::mutex> lk(pool.mu);
    while (pool.started < nr - 1) std::thread(helper, ++pool.started).detach();
  }
  uint32_t g = pool.gen.load(std::memory_order_relaxed) + 1;
  if (g == 0) g = 1;  // helpers start having "seen" generation 0
  Job &job = pool.jobs[g & 1];
  job.fn.store(fn, std::memory_order_relaxed);
  job.ctx.store(ctx, std::memory_order_relaxed);
  job.nchunks.store(nchunks, std::memory_order_relaxed);
  job.nranges.store(nr, std::memory_order_relaxed);
  pool.done.store(0, std::memory_order_relaxed);
  // Stamp every cursor ever used, so no cursor still carries an older generation
  // that a stale helper could claim from with this job's slot values.
  if (nr > pool.used) pool.used = nr;
  for (int r = 0; r < pool.used; r++)
    pool.cur[r].v.store((uint64_t)g << 32 | (uint64_t)(r < nr ? r * nchunks / nr : nchunks), std::memory_order_release);
  pool.gen.store(g, std::memory_order_seq_cst);
  if (pool.sleepers.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lk(pool.mu); }
    pool.cv.notify_all();
  }
  work(g, 0);
  while (pool.done.load(std::memory_order_acquire) < nchunks) cpu_relax();
  pool.busy.store(false, std::memory_order_release);
}

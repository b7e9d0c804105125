// Replays kernel calls recorded on x86 (tests/arm/recorder.py) against a kernel library built
// for another target, and checks every buffer each call can reach against the bytes the x86
// run left there: floats within a relative tolerance of the buffer's largest value, the rest
// exactly. Runs natively or under qemu-user.
//
//   replay LIBRARY RECORDING [--rtol R] [--quiet] [--rows-alone]
//
// --rows-alone: also run each row of every tk_gemv call of several activation rows alone, and
// require the same bits as in the batch (the kernels' batch invariance).
//
// Recording: "TKREC1\0\0", u32 calls; per call: u16 name length, name, u32 buffers; per buffer:
// u8 element type (0 bytes, 1 f32, 2 f16, 3 bf16), u64 size, u32 pointer fixes, u8 changed,
// the fixes (u64 offset, u32 buffer, u64 offset into it), the bytes before, and where the call
// changed them the bytes after; u32 arguments; per
// argument: u8 kind (0 int32, 1 int64: i64; 2 float: f32; 3 pointer: u32 buffer, u64 offset;
// 4 null: i64), then the i64 result (-2^62 for a void function).
//
// Every argument is passed as an int64 in the integer registers and stack slots, floats in
// the first float registers: the calling conventions of x86-64 Linux and AArch64 Linux give
// each integer or pointer argument one such slot in order and floats their own registers, so
// one call shape serves every exported signature (at most 2 floats and 24 integers).
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

typedef int64_t (*Call)(float, float, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
static const int64_t VOID_RESULT = -(1LL << 62);

struct Reader {
  const uint8_t *p, *end;
  template <class T> T get() {
    if (p + sizeof(T) > end) { fprintf(stderr, "replay: recording truncated\n"); exit(2); }
    T v; memcpy(&v, p, sizeof(T)); p += sizeof(T); return v;
  }
  const uint8_t *take(uint64_t n) {
    if (p + n > end) { fprintf(stderr, "replay: recording truncated\n"); exit(2); }
    const uint8_t *q = p; p += n; return q;
  }
};

struct Buffer {
  uint8_t type;
  uint64_t size;
  std::vector<uint64_t> fix_off, fix_to;
  std::vector<uint32_t> fix_buf;
  const uint8_t *before, *after;
  uint8_t *mem;
};

static float element(const uint8_t *p, int type) {
  if (type == 1) { float f; memcpy(&f, p, 4); return f; }
  uint16_t h; memcpy(&h, p, 2);
  if (type == 3) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;  // IEEE half
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}

// The largest error of `got` against `want` relative to the largest |want| (floats), or the
// count of differing bytes (anything else).
static double compare(const Buffer &b, const uint8_t *got, double rtol, std::string &why) {
  if (b.type == 0) {
    uint64_t diff = 0, first = 0;
    for (uint64_t i = 0; i < b.size; i++) if (got[i] != b.after[i] && !diff++) first = i;
    if (diff) { char m[128]; snprintf(m, sizeof m, "%llu of %llu bytes differ (first at %llu)", (unsigned long long)diff, (unsigned long long)b.size, (unsigned long long)first); why = m; }
    return diff ? 1e30 : 0;
  }
  const int w = b.type == 1 ? 4 : 2;
  const uint64_t n = b.size / w;
  double scale = 0, worst = 0;
  uint64_t at = 0;
  for (uint64_t i = 0; i < n; i++) {
    const float v = element(b.after + i * w, b.type);
    if (isfinite(v) && fabs(v) > scale) scale = fabs(v);
  }
  for (uint64_t i = 0; i < n; i++) {
    const float x = element(got + i * w, b.type), y = element(b.after + i * w, b.type);
    double err;
    if (!isfinite(y) || !isfinite(x)) err = (isnan(x) && isnan(y)) || x == y ? 0 : 1e30;
    else err = fabs((double)x - y) / (scale > 0 ? scale : 1);
    if (err > worst) { worst = err; at = i; }
  }
  if (worst > rtol) {
    char m[160];
    snprintf(m, sizeof m, "element %llu of %llu: %g against %g (error %.3g of the largest %g)", (unsigned long long)at,
             (unsigned long long)n, element(got + at * w, b.type), element(b.after + at * w, b.type), worst, scale);
    why = m;
  }
  return worst;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: replay LIBRARY RECORDING [--rtol R] [--quiet]\n"); return 2; }
  double rtol = 1e-5;
  bool quiet = false, alone = false;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--rtol") && i + 1 < argc) rtol = atof(argv[++i]);
    else if (!strcmp(argv[i], "--quiet")) quiet = true;
    else if (!strcmp(argv[i], "--rows-alone")) alone = true;
  }
  int alone_rows = 0, alone_failed = 0;
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "replay: %s\n", dlerror()); return 2; }
  FILE *f = fopen(argv[2], "rb");
  if (!f) { perror(argv[2]); return 2; }
  std::vector<uint8_t> data;
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) data.insert(data.end(), chunk, chunk + got);
  fclose(f);
  Reader r{data.data(), data.data() + data.size()};
  if (memcmp(r.take(8), "TKREC1\0\0", 8)) { fprintf(stderr, "replay: not a recording\n"); return 2; }
  const uint32_t ncalls = r.get<uint32_t>();
  std::map<std::string, std::pair<int, int>> tally;  // name: (passed, failed)
  int failed = 0;
  double worst = 0;  // the largest float error of a passing buffer
  for (uint32_t c = 0; c < ncalls; c++) {
    const uint16_t len = r.get<uint16_t>();
    const std::string name((const char *)r.take(len), len);
    std::vector<Buffer> bufs(r.get<uint32_t>());
    for (Buffer &b : bufs) {
      b.type = r.get<uint8_t>();
      b.size = r.get<uint64_t>();
      const uint32_t nfix = r.get<uint32_t>();
      const uint8_t changed = r.get<uint8_t>();
      for (uint32_t k = 0; k < nfix; k++) {
        b.fix_off.push_back(r.get<uint64_t>());
        b.fix_buf.push_back(r.get<uint32_t>());
        b.fix_to.push_back(r.get<uint64_t>());
      }
      b.before = r.take(b.size);
      b.after = changed ? r.take(b.size) : b.before;
      b.mem = (uint8_t *)aligned_alloc(64, (b.size + 63) / 64 * 64);
      memcpy(b.mem, b.before, b.size);
    }
    for (Buffer &b : bufs)  // pointers held in buffers now point into this process's copies
      for (size_t k = 0; k < b.fix_off.size(); k++) {
        const uint64_t addr = (uint64_t)(uintptr_t)(bufs[b.fix_buf[k]].mem + b.fix_to[k]);
        memcpy(b.mem + b.fix_off[k], &addr, 8);
      }
    int64_t ints[24] = {0};
    float floats[2] = {0, 0};
    int ni = 0, nf = 0;
    const uint32_t nargs = r.get<uint32_t>();
    for (uint32_t a = 0; a < nargs; a++) {
      const uint8_t kind = r.get<uint8_t>();
      if (kind == 2) { floats[nf++] = r.get<float>(); continue; }
      if (kind == 3) {
        const uint32_t buf = r.get<uint32_t>();
        ints[ni++] = (int64_t)(uintptr_t)(bufs[buf].mem + r.get<uint64_t>());
      } else {
        ints[ni++] = r.get<int64_t>();
      }
    }
    const int64_t want = r.get<int64_t>();
    Call fn = (Call)dlsym(lib, name.c_str());
    if (!fn) { fprintf(stderr, "replay: %s not in the library\n", name.c_str()); return 2; }
    const int64_t res = fn(floats[0], floats[1], ints[0], ints[1], ints[2], ints[3], ints[4], ints[5], ints[6], ints[7],
                           ints[8], ints[9], ints[10], ints[11], ints[12], ints[13], ints[14], ints[15], ints[16],
                           ints[17], ints[18], ints[19], ints[20], ints[21], ints[22], ints[23]);
    std::string why;
    if (want != VOID_RESULT && (int32_t)res != (int32_t)want) why = "returned " + std::to_string((int32_t)res) + ", not " + std::to_string(want);
    for (size_t i = 0; i < bufs.size() && why.empty(); i++) {
      std::string w;
      const double err = compare(bufs[i], bufs[i].mem, rtol, w);
      if (err <= rtol && err > worst) worst = err;
      if (err > rtol) {
        // a buffer holding pointers holds this process's addresses: compare the rest of it
        if (!bufs[i].fix_off.empty()) {
          std::vector<uint8_t> copy(bufs[i].mem, bufs[i].mem + bufs[i].size);
          for (size_t k = 0; k < bufs[i].fix_off.size(); k++) memcpy(copy.data() + bufs[i].fix_off[k], bufs[i].after + bufs[i].fix_off[k], 8);
          w.clear();
          if (compare(bufs[i], copy.data(), rtol, w) <= rtol) continue;
        }
        why = "buffer " + std::to_string(i) + ": " + w;
      }
    }
    if (alone && name == "tk_gemv" && ints[6] > 1 && why.empty()) {  // (type, w, ldw, N, K, x, M, y, nth)
      const int64_t N = ints[3], K = ints[4], M = ints[6];
      const float *x = (const float *)(uintptr_t)ints[5], *y = (const float *)(uintptr_t)ints[7];
      std::vector<float> one(N);
      for (int64_t m = 0; m < M; m++) {
        fn(0, 0, ints[0], ints[1], ints[2], N, K, (int64_t)(uintptr_t)(x + m * K), 1, (int64_t)(uintptr_t)one.data(), ints[8], 0,
           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        alone_rows++;
        if (memcmp(one.data(), y + m * N, N * 4)) {
          alone_failed++;
          why = "row " + std::to_string(m) + " of " + std::to_string(M) + " differs alone";
        }
      }
    }
    auto &t = tally[name];
    if (why.empty()) t.first++;
    else {
      t.second++;
      if (failed++ < 20 || !quiet) fprintf(stderr, "FAIL call %u %s: %s\n", c, name.c_str(), why.c_str());
    }
    for (Buffer &b : bufs) free(b.mem);
  }
  for (auto &kv : tally) printf("%-18s %5d passed %5d failed\n", kv.first.c_str(), kv.second.first, kv.second.second);
  if (alone) printf("rows alone: %d checked, %d differ from their batch\n", alone_rows, alone_failed);
  printf("%u calls, %d failed (rtol %g; largest error passed %.2g)\n", ncalls, failed, rtol, worst);
  return failed ? 1 : 0;
}

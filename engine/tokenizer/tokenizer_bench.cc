// Encode / decode throughput of the tokenizer on source code (this package's own C++ files,
// repeated to a few MB), printed as MB/s and tokens/s. Not a test.
//
//   bazel run -c opt //engine/tokenizer:tokenizer_bench --
//       [--tokenizer_dir=engine/testdata/tokenizers/llama3] [--mb=4] [--threads=2]
//
// "cold" is the first pass over the text (empty word cache), "warm" the best of the next passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using deepinfer::tokenizer::IncrementalDetokenizer;
using deepinfer::tokenizer::Tokenizer;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string CodeText(size_t target_bytes) {
  std::string one;
  for (const char* dir : {"engine/tokenizer", "engine/tokenizer/internal"}) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".cc" || ext == ".h") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      one += ss.str();
    }
  }
  if (one.empty()) {
    std::fprintf(stderr, "no source files found; run through bazel run\n");
    std::exit(2);
  }
  std::string text;
  while (text.size() < target_bytes) text += one;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "engine/testdata/tokenizers/llama3";
  double mb = 4;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--tokenizer_dir=")) {
      dir = arg.substr(16);
    } else if (absl::StartsWith(arg, "--mb=") && absl::SimpleAtod(arg.substr(5), &mb) && mb > 0) {
    } else if (absl::StartsWith(arg, "--threads=") && absl::SimpleAtoi(arg.substr(10), &threads) &&
               threads > 0) {
    } else {
      std::fprintf(stderr, "usage: %s [--tokenizer_dir=DIR] [--mb=N] [--threads=N]\n", argv[0]);
      return 2;
    }
  }
  auto t0 = Clock::now();
  auto loaded = Tokenizer::FromDirectory(dir);
  auto t1 = Clock::now();
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const Tokenizer& tok = **loaded;
  const std::string text = CodeText(static_cast<size_t>(mb * 1e6));
  const double size_mb = text.size() / 1e6;
  std::printf("tokenizer %s: vocab %d, loaded in %.1f ms\n", dir.c_str(), tok.vocab_size(),
              1e3 * Seconds(t0, t1));

  std::vector<int32_t> ids;
  double best = 1e30;
  for (int pass = 0; pass < 4; ++pass) {
    auto a = Clock::now();
    auto r = tok.Encode(text, false);
    auto b = Clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 1;
    }
    ids = std::move(*r);
    if (pass == 0) {
      std::printf("encode cold: %.2f MB in %.3f s = %.1f MB/s (%zu tokens, %.2f bytes/token)\n",
                  size_mb, Seconds(a, b), size_mb / Seconds(a, b), ids.size(),
                  static_cast<double>(text.size()) / ids.size());
    } else {
      best = std::min(best, Seconds(a, b));
    }
  }
  std::printf("encode warm: %.1f MB/s, %.2f M tokens/s\n", size_mb / best, ids.size() / best / 1e6);

  // Many short requests from several threads, as a server would see them.
  {
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < text.size(); pos += 2000) chunks.push_back(text.substr(pos, 2000));
    auto a = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (size_t i = t; i < chunks.size(); i += threads) {
          if (!tok.Encode(chunks[i], true).ok()) std::abort();
        }
      });
    }
    for (auto& th : pool) th.join();
    auto b = Clock::now();
    std::printf("encode 2 KB requests on %d threads: %.1f MB/s total\n", threads,
                size_mb / Seconds(a, b));
  }

  auto a = Clock::now();
  auto decoded = tok.Decode(ids, false);
  auto b = Clock::now();
  if (!decoded.ok() || *decoded != text) {
    std::fprintf(stderr, "decode mismatch\n");
    return 1;
  }
  std::printf("decode: %.1f MB/s, %.2f M tokens/s\n", size_mb / Seconds(a, b),
              ids.size() / Seconds(a, b) / 1e6);

  a = Clock::now();
  IncrementalDetokenizer detok(tok, false);
  size_t streamed = 0;
  for (int32_t id : ids) streamed += detok.Push(id)->size();
  streamed += detok.Flush()->size();
  b = Clock::now();
  std::printf("incremental detokenize: %.2f M tokens/s (%.0f ns/token)%s\n",
              ids.size() / Seconds(a, b) / 1e6, 1e9 * Seconds(a, b) / ids.size(),
              streamed == text.size() ? "" : " SIZE MISMATCH");
  return 0;
}

// A driver that runs a libFuzzer-style target (`LLVMFuzzerTestOneInput`) as an ordinary test
// with any compiler: every file of the seed corpus, then random mutations of them for a time
// budget. The same target builds under clang with -fsanitize=fuzzer for coverage-guided runs
// (scripts/fuzz.sh). A crash, sanitizer report or abort fails the test.
//
// Usage: <binary> [--seconds=N] [--seed=S] [corpus files or directories...]
//   Defaults: 5 seconds, seed 1, corpus from $FUZZ_CORPUS or the arguments.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> LoadCorpus(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(p, ec)) {
        if (!entry.is_regular_file()) continue;
        std::ifstream in(entry.path(), std::ios::binary);
        out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    } else if (std::filesystem::is_regular_file(p, ec)) {
      std::ifstream in(p, std::ios::binary);
      out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
      std::fprintf(stderr, "fuzz_main: corpus path not found: %s\n", p.c_str());
      std::exit(2);
    }
  }
  return out;
}

std::string Mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  std::string s = corpus.empty() ? std::string() : corpus[rng() % corpus.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // random byte
        if (!s.empty()) s[rng() % s.size()] = static_cast<char>(rng());
        break;
      case 2:  // insert random bytes
        s.insert(s.empty() ? 0 : rng() % (s.size() + 1), std::string(1 + rng() % 4, static_cast<char>(rng())));
        break;
      case 3:  // erase a range
        if (!s.empty()) {
          const size_t at = rng() % s.size();
          s.erase(at, 1 + rng() % std::min<size_t>(16, s.size() - at));
        }
        break;
      case 4:  // splice with another corpus entry
        if (!corpus.empty()) {
          const std::string& other = corpus[rng() % corpus.size()];
          if (!other.empty()) {
            const size_t from = rng() % other.size();
            s.insert(s.empty() ? 0 : rng() % (s.size() + 1), other.substr(from, 1 + rng() % 32));
          }
        }
        break;
      case 5:  // truncate
        if (!s.empty()) s.resize(rng() % s.size());
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5.0;
  uint64_t seed = 1;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--seconds=", 10) == 0) {
      seconds = std::atof(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      paths.emplace_back(argv[i]);
    }
  }
  if (const char* env = std::getenv("FUZZ_CORPUS"); env != nullptr && paths.empty()) {
    paths.emplace_back(env);
  }
  const std::vector<std::string> corpus = LoadCorpus(paths);
  for (const std::string& input : corpus) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  while (std::chrono::steady_clock::now() < end) {
    const std::string input = Mutate(corpus, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    ++runs;
  }
  std::printf("fuzz_main: %zu corpus inputs, %llu mutated inputs, no crash\n", corpus.size(),
              static_cast<unsigned long long>(runs));
  return 0;
}

// Self-test of //common:fuzz_main: a target that checks an invariant on every input (the
// driver must deliver each input intact: size matches what a strlen-free scan sees).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string copy(reinterpret_cast<const char*>(data), size);
  if (copy.size() != size) std::abort();
  for (size_t i = 0; i < size; ++i) {
    if (static_cast<uint8_t>(copy[i]) != data[i]) std::abort();
  }
  return 0;
}

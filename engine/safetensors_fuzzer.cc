// Fuzz target: the safetensors parser must return a Status for any input, never crash, and every
// tensor it accepts must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tensors = deepinfer::engine::ParseSafetensors(bytes, "fuzz.safetensors");
  if (tensors.ok()) {
    for (const auto& t : *tensors) {
      const char* begin = static_cast<const char*>(t.data);
      if (begin < bytes.data() || begin + t.nbytes > bytes.data() + size) std::abort();
    }
  }
  return 0;
}

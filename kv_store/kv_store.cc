#include "kv_store/kv_store.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace deepinfer {

absl::Status KvStore::ReadLayers(const KvBlockKey& key, uint32_t first_layer, uint32_t num_layers,
                                 absl::Span<uint8_t> dst, absl::Time deadline) {
  DI_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockReader> reader, OpenForRead(key, deadline));
  return reader->ReadLayers(first_layer, num_layers, dst, deadline);
}

absl::Status KvStore::Read(const KvBlockKey& key, absl::Span<uint8_t> dst, absl::Time deadline) {
  return ReadLayers(key, 0, config().layout.num_layers, dst, deadline);
}

absl::Status KvStore::Write(const KvBlockKey& key, absl::Span<const uint8_t> src,
                            absl::Time deadline) {
  DI_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockWriter> writer, Reserve(key, deadline));
  DI_RETURN_IF_ERROR(writer->WriteLayers(0, config().layout.num_layers, src));
  return writer->Commit(deadline);
}

absl::Status ValidateKvStoreConfig(const KvStoreConfig& config, uint64_t object_bytes) {
  if (config.layout.num_layers == 0 || config.layout.bytes_per_layer == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv store: expected a layout with layers and bytes, found ", config.layout.num_layers,
        " layers x ", config.layout.bytes_per_layer, " bytes"));
  }
  if (!(config.low_watermark > 0 && config.low_watermark <= config.high_watermark &&
        config.high_watermark <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv store: expected 0 < low_watermark <= high_watermark <= 1, found ",
                     config.low_watermark, " and ", config.high_watermark));
  }
  if (WatermarkBytes(config.capacity_bytes, config.high_watermark) < object_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv store: capacity below the high watermark (",
                     WatermarkBytes(config.capacity_bytes, config.high_watermark),
                     " bytes) is smaller than one object (", object_bytes, " bytes)"));
  }
  if (config.reservation_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kv store: reservation_timeout must be positive");
  }
  if (!config.clock) return absl::InvalidArgumentError("kv store: no clock");
  return absl::OkStatus();
}

}  // namespace deepinfer

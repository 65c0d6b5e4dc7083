// deepinfer.internal.v1.Encoder: images -> the embeddings that replace their placeholder tokens
// in the language model's prompt.
//
// Encode checks the request before encoding anything (INVALID_ARGUMENT naming the field:
// request_id empty; images: 1..max_images; images[i].data empty or larger than max_image_bytes;
// images[i].content_hash not empty and not the 32-byte SHA-256 of the data); an image that does
// not decode (not PNG/JPEG, truncated, corrupt, over the pixel limit) fails the request with
// INVALID_ARGUMENT naming images[i].data and the decoder's reason when it is reached. It serves each
// image from the embedding cache or encodes it (decode, the model's preprocessing, vision tower,
// projector). Embeddings are float32 ("f32"), rows = the model's image tokens, columns = the
// language model's hidden size. A request past its deadline_unix_us (or the gRPC deadline) gets
// DEADLINE_EXCEEDED, a cancelled call CANCELLED, between images.
//
// FetchEmbeddings returns a cached image's embeddings inline, NOT_FOUND once evicted (the caller
// encodes again).
//
// Thread-safety: RPCs run concurrently; the encoder serialises the tower internally, the cache is
// thread-safe and encodes each image once even when requests race for it.
#ifndef DEEPINFER_VISION_ENCODER_ENCODER_SERVICE_H_
#define DEEPINFER_VISION_ENCODER_ENCODER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "engine/vision/vision_encoder.h"
#include "proto/deepinfer/internal/v1/encoder.grpc.pb.h"
#include "vision_encoder/embedding_cache.h"

namespace deepinfer::vision_encoder {

class EncoderService final : public internal::v1::Encoder::Service {
 public:
  struct Options {
    // Reported in handles kept for FetchEmbeddings.
    std::string worker_id;
    int max_images = 16;
    int64_t max_image_bytes = 20 << 20;
  };
  struct Counters {
    int64_t requests_ok = 0;
    int64_t requests_failed = 0;
    int64_t requests_cancelled = 0;
    int64_t active_requests = 0;
    int64_t images_served = 0;   // every image answered, cache hits included
    int64_t images_encoded = 0;  // those that ran the tower
  };

  // `encoder` and `cache` are not owned and must outlive the service.
  EncoderService(const engine::vision::VisionEncoder* encoder, EmbeddingCache* cache,
                 Options options);

  grpc::Status Encode(grpc::ServerContext* context, const internal::v1::EncodeRequest* request,
                      internal::v1::EncodeResponse* response) override;
  grpc::Status FetchEmbeddings(grpc::ServerContext* context,
                               const internal::v1::FetchEmbeddingsRequest* request,
                               internal::v1::EmbeddingHandle* response) override;

  Counters counters() const;

 private:
  absl::Status DoEncode(grpc::ServerContext* context, const internal::v1::EncodeRequest& request,
                        internal::v1::EncodeResponse* response);

  const engine::vision::VisionEncoder* const encoder_;
  EmbeddingCache* const cache_;
  const Options options_;
  std::atomic<int64_t> requests_ok_{0};
  std::atomic<int64_t> requests_failed_{0};
  std::atomic<int64_t> requests_cancelled_{0};
  std::atomic<int64_t> active_requests_{0};
  std::atomic<int64_t> images_served_{0};
  std::atomic<int64_t> images_encoded_{0};
};

}  // namespace deepinfer::vision_encoder

#endif  // DEEPINFER_VISION_ENCODER_ENCODER_SERVICE_H_

#include "vision_encoder/encoder_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace deepinfer::vision_encoder {
namespace {

constexpr size_t kSha256Bytes = 32;

absl::Status CheckLive(grpc::ServerContext* context, int64_t deadline_unix_us) {
  if (context != nullptr && context->IsCancelled()) {
    return absl::CancelledError("the caller cancelled the request");
  }
  if (deadline_unix_us > 0 && absl::ToUnixMicros(absl::Now()) > deadline_unix_us) {
    return absl::DeadlineExceededError("deadline_unix_us passed before the images were encoded");
  }
  return absl::OkStatus();
}

void FillHandle(const std::string& hash, const Embedding& e, bool inline_data,
                const std::string& worker_id, internal::v1::EmbeddingHandle* handle) {
  handle->set_content_hash(hash);
  handle->set_num_tokens(static_cast<uint32_t>(e.rows));
  handle->set_hidden_size(static_cast<uint32_t>(e.cols));
  handle->set_dtype("f32");
  if (inline_data) {
    handle->set_data(reinterpret_cast<const char*>(e.data.data()), e.data.size() * sizeof(float));
  } else {
    handle->set_encoder_id(worker_id);
  }
}

}  // namespace

EncoderService::EncoderService(const engine::vision::VisionEncoder* encoder, EmbeddingCache* cache,
                               Options options)
    : encoder_(encoder), cache_(cache), options_(std::move(options)) {}

grpc::Status EncoderService::Encode(grpc::ServerContext* context,
                                    const internal::v1::EncodeRequest* request,
                                    internal::v1::EncodeResponse* response) {
  ++active_requests_;
  const absl::Status status = DoEncode(context, *request, response);
  --active_requests_;
  if (status.ok()) {
    ++requests_ok_;
  } else if (status.code() == absl::StatusCode::kCancelled) {
    ++requests_cancelled_;
  } else {
    ++requests_failed_;
    spdlog::info("[req={}] Encode failed: {}", request->request_id(), status.ToString());
  }
  return ToGrpcStatus(status);
}

absl::Status EncoderService::DoEncode(grpc::ServerContext* context,
                                      const internal::v1::EncodeRequest& request,
                                      internal::v1::EncodeResponse* response) {
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError("request_id: expected a non-empty id");
  }
  if (request.images_size() < 1 || request.images_size() > options_.max_images) {
    return absl::InvalidArgumentError(absl::StrCat("images: expected 1..", options_.max_images,
                                                   " images; got ", request.images_size()));
  }
  // Validate everything before encoding anything: a bad image fails the request at once.
  std::vector<std::string> hashes;
  hashes.reserve(static_cast<size_t>(request.images_size()));
  for (int i = 0; i < request.images_size(); ++i) {
    const internal::v1::ImageInput& image = request.images(i);
    const std::string field = absl::StrCat("images[", i, "]");
    if (image.data().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".data: empty image"));
    }
    if (static_cast<int64_t>(image.data().size()) > options_.max_image_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".data: ", image.data().size(),
                                                     " bytes exceed the limit of ",
                                                     options_.max_image_bytes));
    }
    std::string hash = Sha256(image.data());
    if (!image.content_hash().empty()) {
      if (image.content_hash().size() != kSha256Bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".content_hash: expected 32 bytes (SHA-256); got ",
                         image.content_hash().size()));
      }
      if (image.content_hash() != hash) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".content_hash: not the SHA-256 of ", field, ".data (", HexLower(hash), ")"));
      }
    }
    hashes.push_back(std::move(hash));
  }
  uint32_t hits = 0;
  for (int i = 0; i < request.images_size(); ++i) {
    DI_RETURN_IF_ERROR(CheckLive(context, request.deadline_unix_us()));
    const std::string& data = request.images(i).data();
    absl::StatusOr<EmbeddingCache::Result> result =
        cache_->GetOrCompute(hashes[i], [&]() -> absl::StatusOr<Embedding> {
          DI_ASSIGN_OR_RETURN(std::vector<float> rows, encoder_->EncodeImage(data));
          ++images_encoded_;
          Embedding e;
          e.rows = encoder_->num_image_tokens();
          e.cols = encoder_->output_hidden_size();
          e.data = std::move(rows);
          return e;
        });
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kInvalidArgument) {
        return absl::InvalidArgumentError(
            absl::StrCat("images[", i, "].data: ", result.status().message()));
      }
      return result.status();
    }
    if (result->hit) ++hits;
    ++images_served_;
    FillHandle(hashes[i], *result->embedding, request.inline_data(), options_.worker_id,
               response->add_embeddings());
  }
  response->set_cache_hits(hits);
  return absl::OkStatus();
}

grpc::Status EncoderService::FetchEmbeddings(grpc::ServerContext* /*context*/,
                                             const internal::v1::FetchEmbeddingsRequest* request,
                                             internal::v1::EmbeddingHandle* response) {
  if (request->content_hash().size() != kSha256Bytes) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("content_hash: expected 32 bytes (SHA-256); got ",
                     request->content_hash().size())));
  }
  std::shared_ptr<const Embedding> e = cache_->Peek(request->content_hash());
  if (e == nullptr) {
    return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "content_hash: ", HexLower(request->content_hash()), " is not cached (encode it again)")));
  }
  FillHandle(request->content_hash(), *e, /*inline_data=*/true, options_.worker_id, response);
  return grpc::Status::OK;
}

EncoderService::Counters EncoderService::counters() const {
  Counters c;
  c.requests_ok = requests_ok_.load();
  c.requests_failed = requests_failed_.load();
  c.requests_cancelled = requests_cancelled_.load();
  c.active_requests = active_requests_.load();
  c.images_served = images_served_.load();
  c.images_encoded = images_encoded_.load();
  return c;
}

}  // namespace deepinfer::vision_encoder

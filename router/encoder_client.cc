#include "router/encoder_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a: stable across processes and builds (absl::Hash is not).
uint64_t Fnv(const std::string& s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

absl::Status CheckAnswer(const internal::v1::EncodeResponse& r, size_t images) {
  if (static_cast<size_t>(r.embeddings_size()) != images) {
    return absl::InternalError(absl::StrCat("encoder returned ", r.embeddings_size(),
                                            " embeddings for ", images, " images"));
  }
  for (int k = 0; k < r.embeddings_size(); ++k) {
    const internal::v1::EmbeddingHandle& e = r.embeddings(k);
    const uint64_t expected = uint64_t{e.num_tokens()} * e.hidden_size() * sizeof(float);
    if (e.dtype() != "f32" || e.num_tokens() == 0 || e.hidden_size() == 0 ||
        e.data().size() != expected) {
      return absl::InternalError(absl::StrCat(
          "encoder returned malformed embeddings for image ", k, ": dtype \"", e.dtype(), "\", ",
          e.num_tokens(), " x ", e.hidden_size(), ", ", e.data().size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<WorkerSnapshot> RankEncoders(const std::vector<WorkerSnapshot>& live,
                                         const std::string& key) {
  std::vector<std::pair<uint64_t, const WorkerSnapshot*>> ranked;
  const uint64_t k = Fnv(key);
  for (const WorkerSnapshot& w : live) {
    if (w.info.role() != internal::v1::WORKER_ROLE_ENCODER) continue;
    ranked.emplace_back(Mix(Fnv(w.info.worker_id(), k)), &w);
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first
                              : a.second->info.worker_id() < b.second->info.worker_id();
  });
  std::vector<WorkerSnapshot> out;
  out.reserve(ranked.size());
  for (const auto& r : ranked) out.push_back(*r.second);
  return out;
}

EncoderClient::EncoderClient(WorkerRegistry* registry, std::string model_id,
                             int max_message_bytes)
    : registry_(registry), model_id_(std::move(model_id)), max_message_bytes_(max_message_bytes) {}

bool EncoderClient::HasEncoder() const {
  for (const WorkerSnapshot& w : registry_->ListLive(model_id_)) {
    if (w.info.role() == internal::v1::WORKER_ROLE_ENCODER) return true;
  }
  return false;
}

std::unique_ptr<internal::v1::Encoder::Stub> EncoderClient::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(max_message_bytes_);
    args.SetMaxSendMessageSize(max_message_bytes_);
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return internal::v1::Encoder::NewStub(channel);
}

absl::StatusOr<EncodedImages> EncoderClient::Encode(const grpc::ServerContext* parent,
                                                    const std::string& request_id,
                                                    const std::vector<std::string>& images,
                                                    const std::vector<std::string>& hashes,
                                                    absl::Time deadline) {
  const std::vector<WorkerSnapshot> ranked =
      RankEncoders(registry_->ListLive(model_id_), hashes.empty() ? "" : hashes.front());
  if (ranked.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no vision encoder for model \"", model_id_, "\" is live"));
  }
  internal::v1::EncodeRequest request;
  request.set_request_id(request_id);
  request.set_inline_data(true);
  request.set_deadline_unix_us(absl::ToUnixMicros(deadline));
  for (size_t k = 0; k < images.size(); ++k) {
    internal::v1::ImageInput* in = request.add_images();
    in->set_data(images[k]);
    in->set_content_hash(hashes[k]);
  }
  absl::Status last;
  for (size_t attempt = 0; attempt < std::min<size_t>(2, ranked.size()); ++attempt) {
    const WorkerSnapshot& encoder = ranked[attempt];
    std::unique_ptr<grpc::ClientContext> call =
        parent != nullptr ? grpc::ClientContext::FromServerContext(*parent)
                          : std::make_unique<grpc::ClientContext>();
    call->set_deadline(absl::ToChronoTime(deadline));
    internal::v1::EncodeResponse response;
    last = FromGrpcStatus(Stub(encoder.info.address())->Encode(call.get(), request, &response));
    if (last.ok()) {
      if (absl::Status s = CheckAnswer(response, images.size()); !s.ok()) return s;
      EncodedImages out;
      out.encoder_id = encoder.info.worker_id();
      out.cache_hits = response.cache_hits();
      out.embeddings.assign(response.embeddings().begin(), response.embeddings().end());
      return out;
    }
    if (last.code() != absl::StatusCode::kUnavailable) break;
    spdlog::warn("[req={}] encoder {} unavailable: {}", request_id, encoder.info.worker_id(),
                 last.ToString());
  }
  return last;
}

}  // namespace deepinfer::router

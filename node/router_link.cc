#include "node/router_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpc/impl/codegen/grpc_types.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "spdlog/spdlog.h"

namespace deepinfer::node {

void SetWorkerRpcDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + kWorkerRpcTimeout));
}

std::unique_ptr<internal::v1::WorkerRegistry::Stub> NewRegistryStub(
    const std::string& router_address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMin)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMin)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMax)));
  return internal::v1::WorkerRegistry::NewStub(
      grpc::CreateCustomChannel(router_address, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<std::unique_ptr<RouterLink>> RouterLink::Create(Options options) {
  if (options.router_address.empty()) {
    return absl::InvalidArgumentError("router_address: expected \"host:port\", got \"\"");
  }
  if (options.worker.worker_id().empty()) {
    return absl::InvalidArgumentError("worker.worker_id: expected 1..128 bytes, got none");
  }
  if (options.worker.incarnation() == 0) {
    return absl::InvalidArgumentError("worker.incarnation: expected non-zero, got 0");
  }
  if (!options.load) return absl::InvalidArgumentError("load: expected a function, got none");
  if (!options.clock) options.clock = [] { return absl::Now(); };
  std::unique_ptr<RouterLink> link(new RouterLink(std::move(options)));
  link->stub_ = NewRegistryStub(link->options_.router_address);
  return link;
}

RouterLink::RouterLink(Options options) : options_(std::move(options)) {}

RouterLink::~RouterLink() { Stop(); }

absl::Status RouterLink::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stop_) {
    return absl::FailedPreconditionError(absl::StrCat("RouterLink for ",
                                                      options_.worker.worker_id(), ": already ",
                                                      stop_ ? "stopped" : "started"));
  }
  started_ = true;
  last_report_ = Now();
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void RouterLink::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // The thread deregisters on its way out.
  if (thread_.joinable()) thread_.join();
}

bool RouterLink::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

void RouterLink::SetRegistered(bool registered) {
  absl::MutexLock lock(&mu_);
  registered_ = registered;
}

absl::Time RouterLink::Now() const { return options_.clock(); }

std::string RouterLink::Who() const {
  return absl::StrCat(options_.log_name, " ", options_.worker.worker_id());
}

void RouterLink::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), kTick);
      if (stop_) break;
    }
    const absl::Time now = Now();
    if (!registered()) {
      if (now >= next_register_) TryRegister(now);
      continue;
    }
    if (now < next_heartbeat_) continue;
    Heartbeat(now);
  }
  if (ever_registered_) Deregister();
}

void RouterLink::TryRegister(absl::Time now) {
  internal::v1::RegisterRequest request;
  *request.mutable_worker() = options_.worker;
  internal::v1::RegisterResponse response;
  grpc::ClientContext context;
  SetWorkerRpcDeadline(&context);
  const absl::Status s = FromGrpcStatus(stub_->Register(&context, request, &response));
  if (!s.ok()) {
    spdlog::warn("{}: Register with router {} failed: {}; retrying in {}", Who(),
                 options_.router_address, s.ToString(), absl::FormatDuration(backoff_));
    next_register_ = now + backoff_;
    backoff_ = std::min(backoff_ * 2, kRegisterBackoffMax);
    return;
  }
  backoff_ = kRegisterBackoffMin;
  heartbeat_ = response.heartbeat_interval_ms() > 0
                   ? absl::Milliseconds(response.heartbeat_interval_ms())
                   : absl::Seconds(1);
  next_heartbeat_ = now + heartbeat_;
  if (options_.log_registration_details) {
    spdlog::info("{}: registered with router {} (heartbeat every {}, {} peers){}", Who(),
                 options_.router_address, absl::FormatDuration(heartbeat_), response.peers_size(),
                 ever_registered_ ? " again" : "");
  } else {
    spdlog::info("{}: registered with router {}", Who(), options_.router_address);
  }
  // The router's new entry holds no KV blocks: say so explicitly with a new snapshot.
  if (ever_registered_) send_all_cleared_ = true;
  ever_registered_ = true;
  SetRegistered(true);
  if (options_.on_registered) options_.on_registered();
}

void RouterLink::Heartbeat(absl::Time now) {
  next_heartbeat_ = now + heartbeat_;
  internal::v1::LoadReport report;
  report.set_worker_id(options_.worker.worker_id());
  report.set_incarnation(options_.worker.incarnation());
  report.set_sequence(++load_sequence_);
  options_.load(now - last_report_, &report);
  last_report_ = now;
  internal::v1::LoadReportResponse response;
  grpc::ClientContext context;
  SetWorkerRpcDeadline(&context);
  const absl::Status s = FromGrpcStatus(stub_->ReportLoad(&context, report, &response));
  if (!s.ok()) {
    spdlog::warn("{}: ReportLoad failed: {}", Who(), s.ToString());
  } else if (!response.known()) {
    spdlog::warn("{}: router does not know this incarnation; registering again", Who());
    SetRegistered(false);
    next_register_ = absl::InfinitePast();
    return;
  }
  if (options_.kv_events) PublishKvEvents();
}

void RouterLink::PublishKvEvents() {
  google::protobuf::RepeatedPtrField<internal::v1::KvEvent> events;
  if (options_.kv_events(&events)) send_all_cleared_ = true;
  if (!events.empty() || send_all_cleared_) {
    internal::v1::KvEventBatch batch;
    batch.set_worker_id(options_.worker.worker_id());
    batch.set_incarnation(options_.worker.incarnation());
    batch.set_sequence(++kv_sequence_);
    if (send_all_cleared_) {
      batch.add_events()->set_kind(internal::v1::KvEvent::KIND_ALL_CLEARED);
      send_all_cleared_ = false;
    }
    for (internal::v1::KvEvent& e : events) *batch.add_events() = std::move(e);
    unacked_.push_back(std::move(batch));
    if (unacked_.size() > kMaxUnackedKvBatches) {
      // The router will see a gap and ask for a resync; start the snapshot now.
      unacked_.clear();
      send_all_cleared_ = true;
    }
  }
  size_t sent = 0;
  for (; sent < unacked_.size(); ++sent) {
    internal::v1::KvEventAck ack;
    grpc::ClientContext context;
    SetWorkerRpcDeadline(&context);
    const absl::Status s = FromGrpcStatus(stub_->PublishKvEvents(&context, unacked_[sent], &ack));
    if (s.code() == absl::StatusCode::kNotFound) {
      SetRegistered(false);
      next_register_ = absl::InfinitePast();
      break;
    }
    if (!s.ok()) {
      spdlog::warn("{}: PublishKvEvents #{} failed: {}", Who(), unacked_[sent].sequence(),
                   s.ToString());
      break;
    }
    if (ack.resync()) send_all_cleared_ = true;
  }
  unacked_.erase(unacked_.begin(), unacked_.begin() + static_cast<ptrdiff_t>(sent));
}

void RouterLink::Deregister() {
  internal::v1::DeregisterRequest request;
  request.set_worker_id(options_.worker.worker_id());
  request.set_incarnation(options_.worker.incarnation());
  internal::v1::DeregisterResponse response;
  grpc::ClientContext context;
  SetWorkerRpcDeadline(&context);
  const absl::Status s = FromGrpcStatus(stub_->Deregister(&context, request, &response));
  if (!s.ok()) {
    spdlog::warn("{}: Deregister failed: {}", Who(), s.ToString());
  } else if (options_.log_deregistration) {
    spdlog::info("{}: deregistered from router {}", Who(), options_.router_address);
  }
}

}  // namespace deepinfer::node

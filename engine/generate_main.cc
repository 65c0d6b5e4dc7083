// //engine:generate — run a checkpoint without the cluster.
//
//   generate --model DIR --prompt "def fib(n):" --max_tokens 32
//   generate --model DIR --chat '[{"role":"user","content":"Hi"}]' --temperature 0.7 --seed 1
//   generate --model DIR --prompt_ids 1,15,27 --json --logprobs 5
//   generate --model DIR --prompts_file prompts.txt --concurrency 8   # through the serving engine
//
// Text is streamed to stdout as it is generated; --json prints one JSON object per prompt with
// the prompt ids, every step's token id, text and logprobs, the text and the finish reason.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/chat_template/chat_template.h"
#include "engine/cuda/cuda_model.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "engine/text_stream.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json, *.safetensors, "
                                  "tokenizer.json, tokenizer_config.json).");
ABSL_FLAG(std::string, prompt, "", "Prompt text (tokenized with the model's special tokens).");
ABSL_FLAG(std::string, chat, "",
          "Chat messages as a JSON array, e.g. '[{\"role\":\"user\",\"content\":\"Hi\"}]'; "
          "rendered with the model's chat template.");
ABSL_FLAG(std::string, prompt_ids, "", "Prompt as comma-separated token ids.");
ABSL_FLAG(std::string, prompts_file, "",
          "One prompt per line (plain text, or a JSON object with \"prompt\" or \"messages\"); "
          "served concurrently through the serving engine.");
ABSL_FLAG(int, concurrency, 8, "With --prompts_file: requests in flight at once.");
ABSL_FLAG(bool, add_generation_prompt, true, "With --chat: append the assistant header.");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass, (0, 1].");
ABSL_FLAG(int, top_k, 0, "Keep the k most likely tokens; 0 disables.");
ABSL_FLAG(double, min_p, 0.0, "Minimum probability relative to the most likely token.");
ABSL_FLAG(double, repetition_penalty, 1.0, "Multiplicative penalty on seen tokens, (0, 2].");
ABSL_FLAG(double, presence_penalty, 0.0, "Additive penalty on generated tokens, [-2, 2].");
ABSL_FLAG(double, frequency_penalty, 0.0, "Penalty per occurrence in the output, [-2, 2].");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed (>= 0); -1 = random.");
ABSL_FLAG(int, max_tokens, 64, "Most tokens to generate.");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Stop strings (comma-separated).");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past end-of-sequence tokens.");
ABSL_FLAG(int, logprobs, 0, "Top-n logprobs per step (0..20), shown with --json.");
ABSL_FLAG(bool, json, false, "Print a JSON object per prompt instead of streaming text.");
ABSL_FLAG(int, threads, 0, "Forward-pass threads; 0 = all cores.");
ABSL_FLAG(int, kv_blocks, 4096, "With --prompts_file: KV-cache blocks.");
ABSL_FLAG(int, block_size, 16, "KV block size in tokens.");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda (one NVIDIA GPU: engine/cuda; single prompts only so far) or auto (cuda "
          "when a device is usable and runs the model, else cpu; says which and why).");

namespace deepinfer::engine {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using tokenizer::Tokenizer;

absl::StatusOr<ojson> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  ojson j = ojson::parse(in, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

// The chat template: <dir>/chat_template.jinja (transformers >= 4.43 saves it there), else
// tokenizer_config.json's "chat_template".
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadTemplate(const std::string& dir,
                                                           const ojson& tokenizer_config) {
  const std::string jinja = dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    std::ifstream in(jinja);
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return ChatTemplate::Create(source);
  }
  return LoadChatTemplate(tokenizer_config, /*has_tools=*/false);
}

std::string TokenText(const Tokenizer& tok, int32_t id) {
  auto s = tok.Decode({id}, /*skip_special_tokens=*/false);
  return s.ok() ? *s : "";
}

struct Session {
  const Tokenizer* tokenizer;
  ojson tokenizer_config;
  std::string dir;
};

absl::StatusOr<std::vector<int32_t>> PromptIds(const Session& s, const std::string& prompt,
                                               const std::string& chat,
                                               const std::string& ids) {
  if (!ids.empty()) {
    std::vector<int32_t> out;
    for (absl::string_view part : absl::StrSplit(ids, ',', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return absl::InvalidArgumentError(absl::StrCat("--prompt_ids: \"", part, "\" is not an integer"));
      }
      out.push_back(id);
    }
    return out;
  }
  if (!chat.empty()) {
    ojson messages = ojson::parse(chat, nullptr, false);
    if (messages.is_discarded() || !messages.is_array()) {
      return absl::InvalidArgumentError("--chat: expected a JSON array of messages");
    }
    DI_ASSIGN_OR_RETURN(std::unique_ptr<ChatTemplate> tmpl, LoadTemplate(s.dir, s.tokenizer_config));
    ojson context = {{"messages", messages},
                     {"add_generation_prompt", absl::GetFlag(FLAGS_add_generation_prompt)}};
    for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      auto it = s.tokenizer_config.find(key);
      if (it != s.tokenizer_config.end() && it->is_string()) context[key] = *it;
      if (it != s.tokenizer_config.end() && it->is_object() && it->contains("content")) {
        context[key] = (*it)["content"];
      }
    }
    DI_ASSIGN_OR_RETURN(std::string text, tmpl->Render(context));
    return s.tokenizer->Encode(text, /*add_special_tokens=*/false);
  }
  return s.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
}

SamplingParams FlagsToSampling() {
  SamplingParams p;
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    p.has_seed = true;
    p.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  }
  p.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  p.stop = absl::GetFlag(FLAGS_stop);
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  p.return_logprobs = p.logprobs > 0;
  return p;
}

ojson StepsJson(const Tokenizer& tok, const std::vector<StepOutput>& steps) {
  ojson out = ojson::array();
  for (const StepOutput& s : steps) {
    ojson step = {{"token", s.token}, {"text", TokenText(tok, s.token)}, {"logprob", s.logprob}};
    if (!s.top.empty()) {
      ojson top = ojson::array();
      for (const TokenLogprob& t : s.top) {
        top.push_back({{"token", t.token}, {"text", TokenText(tok, t.token)}, {"logprob", t.logprob}});
      }
      step["top"] = top;
    }
    out.push_back(step);
  }
  return out;
}

std::vector<int32_t> EosIds(const Model& model, const Tokenizer& tok) {
  std::vector<int32_t> eos(model.config().eos_token_ids.begin(), model.config().eos_token_ids.end());
  if (tok.eos_id().has_value() &&
      std::find(eos.begin(), eos.end(), *tok.eos_id()) == eos.end()) {
    eos.push_back(*tok.eos_id());
  }
  return eos;
}

// `prompt`: tokenized by Main (which also sized a CUDA model's pools from it).
int RunOne(Model& model, CudaModel* cuda, const Session& s, const std::vector<int32_t>& prompt) {
  const SamplingParams sampling = FlagsToSampling();
  const bool as_json = absl::GetFlag(FLAGS_json);
  TextStream stream(*s.tokenizer, sampling.stop);
  auto echo = [&](const std::string& delta) {
    if (!as_json && !delta.empty()) {
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
  };
  GenerateOptions options;
  options.block_size = absl::GetFlag(FLAGS_block_size);
  options.eos_token_ids = EosIds(model, *s.tokenizer);
  const auto start = std::chrono::steady_clock::now();
  auto first = start;
  bool have_first = false;
  const TokenCallback on_token = [&](const StepOutput& step) {
    if (!have_first) {
      first = std::chrono::steady_clock::now();
      have_first = true;
    }
    auto delta = stream.Push(step.token);
    if (delta.ok()) echo(*delta);
    return !stream.stopped();
  };
  absl::StatusOr<GenerateResult> result;
  if (cuda != nullptr) {
    // The device pools were sized for --max_tokens past the longest prompt of this run.
    result = GenerateWith(
        model.config(), cuda->kv_config().num_blocks,
        [&](const std::vector<SequenceInput>& batch, std::vector<float>* logits) {
          return cuda->Forward(batch, logits);
        },
        prompt, sampling, options, on_token);
  } else {
    result = GenerateOne(model, prompt, sampling, options, on_token);
  }
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", result.status().ToString().c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  echo(stream.Finish());
  const auto end = std::chrono::steady_clock::now();
  const double ttft = std::chrono::duration<double>(first - start).count();
  const double total = std::chrono::duration<double>(end - start).count();
  const size_t n = result->steps.size();
  if (as_json) {
    ojson out = {{"prompt_ids", prompt},
                 {"steps", StepsJson(*s.tokenizer, result->steps)},
                 {"text", stream.text()},
                 {"finish_reason", FinishReasonName(result->finish)},
                 {"usage", {{"prompt_tokens", prompt.size()}, {"completion_tokens", n}}},
                 {"timing", {{"ttft_seconds", ttft}, {"total_seconds", total}}}};
    std::printf("%s\n", out.dump(-1, ' ', false, ojson::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%zu prompt tokens, %zu generated, finish %s, TTFT %.1f ms, %.1f tok/s]\n",
                 prompt.size(), n, FinishReasonName(result->finish), ttft * 1e3,
                 n > 1 ? (n - 1) / std::max(1e-9, total - ttft) : 0.0);
  }
  return 0;
}

int RunFile(Model& model, const Session& s) {
  std::ifstream in(absl::GetFlag(FLAGS_prompts_file));
  if (!in) {
    std::fprintf(stderr, "--prompts_file: cannot read %s\n", absl::GetFlag(FLAGS_prompts_file).c_str());
    return 2;
  }
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::string prompt = line, chat;
    ojson j = ojson::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      if (j.contains("messages")) chat = j["messages"].dump();
      prompt = j.value("prompt", "");
    }
    auto ids = PromptIds(s, prompt, chat, "");
    if (!ids.ok()) {
      std::fprintf(stderr, "line %d: %s\n", line_no, ids.status().ToString().c_str());
      return 2;
    }
    prompts.push_back(*ids);
  }
  EngineOptions options;
  options.num_blocks = absl::GetFlag(FLAGS_kv_blocks);
  options.block_size = absl::GetFlag(FLAGS_block_size);
  options.max_running = absl::GetFlag(FLAGS_concurrency);
  options.eos_token_ids = EosIds(model, *s.tokenizer);
  options.tokenizer = s.tokenizer;  // text deltas and stop strings
  auto engine = LlmEngine::Create(&model, options);
  if (!engine.ok() || !(*engine)->Start().ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<StepOutput>> steps;
  std::map<std::string, std::string> texts;
  std::map<std::string, EngineOutput> finals;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest req;
    req.request_id = std::to_string(i);
    req.prompt = prompts[i];
    req.sampling = FlagsToSampling();
    absl::Status st = (*engine)->Submit(req, [&](const EngineOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = steps[o.request_id];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
      texts[o.request_id] += o.text_delta;
      if (o.finished) {
        finals[o.request_id] = o;
        cv.notify_all();
      }
    });
    if (!st.ok()) {
      std::fprintf(stderr, "prompt %zu: %s\n", i, st.ToString().c_str());
      return 2;
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finals.size() == prompts.size(); });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t generated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = std::to_string(i);
    generated += steps[id].size();
    const EngineOutput& f = finals[id];
    if (!f.status.ok() && f.finish_reason != FinishReason::kAborted) {
      std::fprintf(stderr, "prompt %zu: %s\n", i, f.status.ToString().c_str());
    }
    ojson out = {{"index", i},
                 {"text", texts[id]},
                 {"finish_reason", FinishReasonName(f.finish_reason)},
                 {"usage", {{"prompt_tokens", f.usage.prompt_tokens},
                            {"cached_prompt_tokens", f.usage.cached_prompt_tokens},
                            {"completion_tokens", f.usage.completion_tokens},
                            {"ttft_ms", f.usage.first_token_us / 1000.0}}}};
    if (absl::GetFlag(FLAGS_json)) out["steps"] = StepsJson(*s.tokenizer, steps[id]);
    std::printf("%s\n", out.dump(-1, ' ', false, ojson::error_handler_t::replace).c_str());
  }
  std::fprintf(stderr, "[%zu prompts, %lld tokens generated in %.2f s: %.1f tok/s]\n", prompts.size(),
               static_cast<long long>(generated), secs, generated / secs);
  return 0;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    std::fprintf(stderr, "--model: expected a model directory\n");
    return 2;
  }
  const int given = !absl::GetFlag(FLAGS_prompt).empty() + !absl::GetFlag(FLAGS_chat).empty() +
                    !absl::GetFlag(FLAGS_prompt_ids).empty() +
                    !absl::GetFlag(FLAGS_prompts_file).empty();
  if (given != 1) {
    std::fprintf(stderr, "give exactly one of --prompt, --chat, --prompt_ids, --prompts_file\n");
    return 2;
  }
  auto tokenizer = Tokenizer::FromDirectory(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().ToString().c_str());
    return 2;
  }
  ojson tokenizer_config = ojson::object();
  if (std::filesystem::exists(dir + "/tokenizer_config.json")) {
    auto cfg = ReadJson(dir + "/tokenizer_config.json");
    if (!cfg.ok()) {
      std::fprintf(stderr, "error: %s\n", cfg.status().ToString().c_str());
      return 2;
    }
    tokenizer_config = *cfg;
  }
  auto model = Model::Load(dir, ModelOptions{absl::GetFlag(FLAGS_threads)});
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", model.status().ToString().c_str());
    return 2;
  }
  Session s{tokenizer->get(), tokenizer_config, dir};
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda" && device != "auto") {
    std::fprintf(stderr, "--device: expected cpu, cuda or auto, got \"%s\"\n", device.c_str());
    return 2;
  }
  const bool file = !absl::GetFlag(FLAGS_prompts_file).empty();
  if (device == "cuda" && file) {
    std::fprintf(stderr,
                 "--device=cuda: runs --prompt, --chat or --prompt_ids; the serving engine "
                 "(--prompts_file) runs on the CPU so far\n");
    return 2;
  }
  if (file) {
    if (device == "auto") {
      std::fprintf(stderr,
                   "[--device=auto: cpu: --prompts_file runs the serving engine on the CPU]\n");
    }
    return RunFile(**model, s);
  }
  auto ids = PromptIds(s, absl::GetFlag(FLAGS_prompt), absl::GetFlag(FLAGS_chat),
                       absl::GetFlag(FLAGS_prompt_ids));
  if (!ids.ok()) {
    std::fprintf(stderr, "error: %s\n", ids.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<CudaModel> cuda;
  if (device != "cpu") {
    // Pools for the prompt + --max_tokens.
    SamplingParams sp;
    sp.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    GenerateOptions go;
    go.block_size = absl::GetFlag(FLAGS_block_size);
    CudaModelOptions co;
    co.block_size = go.block_size;
    co.num_blocks = std::max(GenerateBlocks(*ids, sp, go), 1);
    co.graph_max_batch = 1;  // decode steps replay one CUDA graph
    co.graph_max_blocks_per_seq = co.num_blocks;
    auto created = CudaModel::Create(**model, co);
    if (created.ok()) {
      cuda = *std::move(created);
    } else if (device == "cuda") {
      std::fprintf(stderr, "error: --device=cuda: %s\n", created.status().ToString().c_str());
      return created.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    } else {
      std::fprintf(stderr, "[--device=auto: cpu: %s]\n", created.status().ToString().c_str());
    }
  }
  if (cuda != nullptr && device == "auto") std::fprintf(stderr, "[--device=auto: cuda]\n");
  return RunOne(**model, cuda.get(), s, *ids);
}

}  // namespace
}  // namespace deepinfer::engine

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a Hugging Face checkpoint on the CPU (or one GPU, --device): generate --model DIR "
      "--prompt TEXT");
  absl::ParseCommandLine(argc, argv);
  return deepinfer::engine::Main();
}

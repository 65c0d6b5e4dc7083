#include "api/request_validation.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace deepinfer::api {
namespace {

constexpr size_t kMaxRequestIdBytes = 128;
constexpr size_t kMaxCacheSaltBytes = 256;
constexpr int kMinPriority = -100;
constexpr int kMaxPriority = 100;
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr uint32_t kMaxLogprobs = 20;
// How much of an offending string value an error message quotes.
constexpr size_t kQuoteBytes = 64;

// `"value"` with non-printable bytes escaped, cut at kQuoteBytes.
std::string Quote(absl::string_view value) {
  if (value.size() <= kQuoteBytes) return absl::StrCat("\"", absl::CHexEscape(value), "\"");
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kQuoteBytes)), "\"... (", value.size(),
                      " bytes)");
}

absl::Status Invalid(absl::string_view field, absl::string_view expected, double got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", got));
}

absl::Status InvalidText(absl::string_view field, absl::string_view expected,
                         absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, "; got ", got));
}

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t Utf8ErrorOffset(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return absl::string_view::npos;
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  return ValidateUtf8(field, text);
}

absl::Status CheckCommon(absl::string_view request_id, const v1::SamplingParams& sampling,
                         absl::string_view cache_salt, int32_t priority, int vocab_size) {
  DI_RETURN_IF_ERROR(ValidateRequestId(request_id));
  DI_RETURN_IF_ERROR(ValidateSamplingParams(sampling, vocab_size));
  DI_RETURN_IF_ERROR(ValidateCacheSalt(cache_salt));
  return ValidatePriority(priority);
}

// --- Images ---------------------------------------------------------------------------------

uint32_t ReadBe32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

uint32_t ReadBe16(const unsigned char* p) { return (uint32_t{p[0]} << 8) | p[1]; }

const std::array<uint32_t, 256>& CrcTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table;
}

uint32_t Crc32(const unsigned char* p, size_t n) {
  const auto& table = CrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::Status Malformed(absl::string_view format, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed ", format, ": ", why));
}

absl::StatusOr<ImageHeader> InspectPng(const unsigned char* p, size_t n) {
  constexpr uint32_t kMaxDimension = 0x7FFFFFFF;
  ImageHeader header;
  header.format = ImageFormat::kPng;
  size_t pos = 8;  // after the signature
  bool seen_ihdr = false;
  bool seen_idat = false;
  while (true) {
    if (n - pos < 12) return Malformed("PNG", absl::StrCat("truncated at byte ", n));
    const uint32_t length = ReadBe32(p + pos);
    if (length > 0x7FFFFFFFu || length > n - pos - 12) {
      return Malformed(
          "PNG", absl::StrCat("truncated: chunk at byte ", pos, " declares ", length, " bytes"));
    }
    const unsigned char* type = p + pos + 4;
    const unsigned char* data = p + pos + 8;
    for (int k = 0; k < 4; ++k) {
      const unsigned char c = type[k];
      if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) {
        return Malformed("PNG", absl::StrCat("bad chunk type at byte ", pos + 4));
      }
    }
    const absl::string_view type_name(reinterpret_cast<const char*>(type), 4);
    if (Crc32(type, length + 4) != ReadBe32(data + length)) {
      return Malformed("PNG", absl::StrCat("CRC mismatch in chunk ", type_name, " at byte ", pos));
    }
    if (!seen_ihdr) {
      if (type_name != "IHDR" || length != 13) return Malformed("PNG", "first chunk is not IHDR");
      header.width = ReadBe32(data);
      header.height = ReadBe32(data + 4);
      if (header.width == 0 || header.height == 0 || header.width > kMaxDimension ||
          header.height > kMaxDimension) {
        return Malformed("PNG", absl::StrCat("size ", header.width, "x", header.height));
      }
      const int depth = data[8];
      const int color = data[9];
      const bool depth_ok = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
      const bool color_ok = color == 0 || color == 2 || color == 3 || color == 4 || color == 6;
      if (!depth_ok || !color_ok) {
        return Malformed("PNG", absl::StrCat("bit depth ", depth, ", color type ", color));
      }
      seen_ihdr = true;
    } else if (type_name == "IDAT") {
      seen_idat = true;
    } else if (type_name == "IEND") {
      if (!seen_idat) return Malformed("PNG", "no IDAT chunk");
      return header;  // bytes after IEND are ignored, as decoders do
    }
    pos += size_t{length} + 12;
  }
}

absl::StatusOr<ImageHeader> InspectJpeg(const unsigned char* p, size_t n) {
  ImageHeader header;
  header.format = ImageFormat::kJpeg;
  size_t pos = 2;  // after SOI
  bool seen_frame = false;
  while (true) {
    if (pos >= n) return Malformed("JPEG", "truncated: no EOI marker");
    if (p[pos] != 0xFF) {
      return Malformed("JPEG", absl::StrCat("expected a marker at byte ", pos));
    }
    while (pos < n && p[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= n) return Malformed("JPEG", "truncated: no EOI marker");
    const unsigned char marker = p[pos++];
    if (marker == 0xD9) {
      if (!seen_frame) return Malformed("JPEG", "EOI before any frame");
      return header;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no payload
    if (marker == 0x00 || marker == 0xD8) {
      return Malformed("JPEG", absl::StrCat("unexpected marker at byte ", pos - 1));
    }
    if (n - pos < 2) return Malformed("JPEG", "truncated segment header");
    const uint32_t length = ReadBe16(p + pos);
    if (length < 2 || length > n - pos) {
      return Malformed("JPEG", absl::StrCat("truncated: segment at byte ", pos - 2, " declares ",
                                            length, " bytes"));
    }
    const bool is_frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (is_frame) {
      if (length < 8) return Malformed("JPEG", "short frame header");
      header.height = ReadBe16(p + pos + 3);
      header.width = ReadBe16(p + pos + 5);
      if (header.width == 0 || header.height == 0) {
        return Malformed("JPEG", absl::StrCat("size ", header.width, "x", header.height));
      }
      seen_frame = true;
    }
    pos += length;
    if (marker == 0xDA) {
      if (!seen_frame) return Malformed("JPEG", "scan before any frame header");
      // Entropy-coded data: runs until a marker other than a stuffed 0xFF00 or a restart.
      while (true) {
        if (n - pos < 2) return Malformed("JPEG", "truncated: no EOI marker");
        if (p[pos] == 0xFF && p[pos + 1] != 0x00 && !(p[pos + 1] >= 0xD0 && p[pos + 1] <= 0xD7) &&
            p[pos + 1] != 0xFF) {
          break;
        }
        ++pos;
      }
    }
  }
}

absl::Status CheckImage(const v1::ImagePart& image, const std::string& path,
                        const RequestLimits& limits, ChatImage* out) {
  std::string decoded;
  absl::string_view bytes;
  switch (image.source_case()) {
    case v1::ImagePart::kData:
      bytes = image.data();
      break;
    case v1::ImagePart::kUrl: {
      const absl::string_view url = image.url();
      constexpr absl::string_view kPng = "data:image/png;base64,";
      constexpr absl::string_view kJpeg = "data:image/jpeg;base64,";
      absl::string_view payload;
      if (absl::StartsWithIgnoreCase(url, kPng)) {
        payload = url.substr(kPng.size());
      } else if (absl::StartsWithIgnoreCase(url, kJpeg)) {
        payload = url.substr(kJpeg.size());
      } else {
        return InvalidText(absl::StrCat(path, ".url"),
                           "a data:image/png;base64, or data:image/jpeg;base64, URL (the cluster "
                           "never fetches URLs)",
                           Quote(url));
      }
      // Check the size before decoding: 4 base64 characters carry 3 bytes.
      if (payload.size() / 4 * 3 > limits.max_image_bytes + 2) {
        return InvalidText(path, absl::StrCat("at most ", limits.max_image_bytes, " bytes"),
                           absl::StrCat("about ", payload.size() / 4 * 3, " bytes"));
      }
      if (!Base64Decode(payload, &decoded)) {
        return InvalidText(absl::StrCat(path, ".url"), "valid base64 after the comma",
                           Quote(payload));
      }
      bytes = decoded;
      break;
    }
    case v1::ImagePart::SOURCE_NOT_SET:
      return InvalidText(path, "data or url", "neither");
  }
  if (bytes.empty()) return InvalidText(path, "a PNG or JPEG image", "0 bytes");
  if (bytes.size() > limits.max_image_bytes) {
    return InvalidText(path, absl::StrCat("at most ", limits.max_image_bytes, " bytes"),
                       absl::StrCat(bytes.size(), " bytes"));
  }
  absl::StatusOr<ImageHeader> header = InspectImage(bytes);
  if (!header.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  if (out != nullptr) {
    out->format = header->format;
    out->width = header->width;
    out->height = header->height;
    out->bytes = decoded.empty() ? std::string(bytes) : std::move(decoded);
  }
  return absl::OkStatus();
}

// Validates the request and, when `out` is not null, converts its messages into it.
absl::Status CheckChat(const v1::ChatRequest& request, const RequestLimits& limits,
                       ChatPrompt* out) {
  DI_RETURN_IF_ERROR(CheckCommon(request.request_id(), request.sampling(), request.cache_salt(),
                                 request.priority(), limits.vocab_size));
  if (request.messages().empty()) {
    return InvalidText("messages", "at least one message", "none");
  }
  // The byte cap first: nothing below (UTF-8 scans, conversion) runs over an oversized request.
  size_t text_bytes = 0;
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& message = request.messages(i);
    text_bytes += message.name().size();
    for (int j = 0; j < message.content_size(); ++j) {
      if (message.content(j).part_case() == v1::ContentPart::kText) {
        text_bytes += message.content(j).text().size();
      }
      if (text_bytes > limits.max_chat_text_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "messages[", i, "].content[", j, "].text: expected at most ",
            limits.max_chat_text_bytes,
            " bytes of chat text in the whole request; got ", text_bytes, " by this part"));
      }
    }
  }
  if (out != nullptr) out->messages = nlohmann::ordered_json::array();
  int images_seen = 0;
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& message = request.messages(i);
    const std::string prefix = absl::StrCat("messages[", i, "]");
    const std::string& role = message.role();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return InvalidText(absl::StrCat(prefix, ".role"), "one of system, user, assistant, tool",
                         Quote(role));
    }
    DI_RETURN_IF_ERROR(CheckUtf8(absl::StrCat(prefix, ".name"), message.name()));
    if (message.content().empty() && role != "assistant") {
      return InvalidText(absl::StrCat(prefix, ".content"),
                         "at least one part (only an assistant message may be empty)", "none");
    }
    // Text so far since the last image (merged into one part), and the parts list once an image
    // shows up.
    std::string text;
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    bool has_image = false;
    for (int j = 0; j < message.content_size(); ++j) {
      const v1::ContentPart& part = message.content(j);
      const std::string part_path = absl::StrCat(prefix, ".content[", j, "]");
      switch (part.part_case()) {
        case v1::ContentPart::kText:
          DI_RETURN_IF_ERROR(CheckUtf8(absl::StrCat(part_path, ".text"), part.text()));
          if (out != nullptr) text += part.text();
          break;
        case v1::ContentPart::kImage: {
          if (++images_seen > limits.max_images) {
            return absl::InvalidArgumentError(absl::StrCat(
                part_path, ".image: more than ", limits.max_images, " images in one request"));
          }
          ChatImage image;
          DI_RETURN_IF_ERROR(CheckImage(part.image(), absl::StrCat(part_path, ".image"), limits,
                                        out != nullptr ? &image : nullptr));
          if (out != nullptr) {
            if (!text.empty()) {
              parts.push_back({{"type", "text"}, {"text", std::move(text)}});
              text.clear();
            }
            parts.push_back({{"type", "image"}});
            image.message_index = i;
            image.part_index = j;
            out->images.push_back(std::move(image));
          }
          has_image = true;
          break;
        }
        case v1::ContentPart::PART_NOT_SET:
          return InvalidText(part_path, "text or image", "neither");
      }
    }
    if (out == nullptr) continue;
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    m["role"] = role;
    if (has_image) {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::move(text)}});
      m["content"] = std::move(parts);
    } else {
      m["content"] = std::move(text);
    }
    if (!message.name().empty()) m["name"] = message.name();
    out->messages.push_back(std::move(m));
  }
  if (out != nullptr) {
    out->add_generation_prompt =
        request.has_add_generation_prompt() ? request.add_generation_prompt() : true;
  }
  return absl::OkStatus();
}

absl::StatusOr<float> JsonFloat(const nlohmann::json& config, const char* key, float fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return InvalidText(absl::StrCat("generation_config.", key), "a number", it->dump());
  }
  return it->get<float>();
}

}  // namespace

absl::Status ValidateUtf8(absl::string_view field, absl::string_view text) {
  const size_t bad = Utf8ErrorOffset(text);
  if (bad == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected UTF-8 text, got an invalid byte sequence at byte ", bad));
}

bool IsValidUtf8(absl::string_view text) {
  return Utf8ErrorOffset(text) == absl::string_view::npos;
}

bool Base64Decode(absl::string_view in, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t data_len = in.size();
  if (data_len % 4 == 0 && data_len > 0) {
    // Padded form: at most two trailing '='.
    if (in[data_len - 1] == '=') --data_len;
    if (in[data_len - 1] == '=') --data_len;
  }
  if (data_len % 4 == 1) return false;
  out->clear();
  out->reserve(data_len / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < data_len; ++i) {
    const int v = value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  // Leftover bits of the last group must be zero (canonical encoding).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return false;
  return true;
}

absl::StatusOr<ImageHeader> InspectImage(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  static constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::equal(kPngSignature, kPngSignature + 8, p)) return InspectPng(p, n);
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return InspectJpeg(p, n);
  std::string found = "unknown data";
  if (absl::StartsWith(bytes, "GIF8")) {
    found = "GIF";
  } else if (n >= 12 && absl::StartsWith(bytes, "RIFF") && bytes.substr(8, 4) == "WEBP") {
    found = "WebP";
  } else if (absl::StartsWith(bytes, "BM")) {
    found = "BMP";
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected PNG or JPEG data; got ", found, " (", n, " bytes)"));
}

absl::Status ValidateRequestId(absl::string_view id) {
  // Empty: the router generates one.
  if (id.size() > kMaxRequestIdBytes) {
    return InvalidText("request_id", "1..128 printable ASCII bytes",
                       absl::StrCat(id.size(), " bytes"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c > 0x7E) {
      return InvalidText(
          "request_id", "1..128 printable ASCII bytes",
          absl::StrCat(Quote(id), " (byte ", i, " is 0x", absl::Hex(c, absl::kZeroPad2), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCacheSalt(absl::string_view cache_salt) {
  if (cache_salt.size() > kMaxCacheSaltBytes) {
    return InvalidText("cache_salt", "at most 256 bytes",
                       absl::StrCat(cache_salt.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePriority(int32_t priority) {
  if (priority < kMinPriority || priority > kMaxPriority) {
    return Invalid("priority", "-100..100", priority);
  }
  return absl::OkStatus();
}

absl::Status ValidatePromptTokenIds(absl::Span<const uint32_t> ids, int vocab_size) {
  if (ids.empty()) return InvalidText("prompt_token_ids", "at least one token", "none");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (vocab_size <= 0 || ids[i] >= static_cast<uint32_t>(vocab_size)) {
      return Invalid(absl::StrCat("prompt_token_ids[", i, "]"),
                     absl::StrCat("a token id in [0, ", vocab_size, ")"), ids[i]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ResolveMaxTokens(uint32_t max_tokens, int64_t prompt_tokens,
                                         int64_t context) {
  if (max_tokens == 0) {
    if (prompt_tokens >= context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.max_tokens: 0 means up to the context, but the prompt (", prompt_tokens,
          " tokens) leaves no room in the model's context of ", context, " tokens"));
    }
    return context - prompt_tokens;
  }
  if (prompt_tokens + static_cast<int64_t>(max_tokens) > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens: expected prompt + max_tokens <= ", context,
                     " (the model's context), got ", prompt_tokens, " + ", max_tokens, " = ",
                     prompt_tokens + static_cast<int64_t>(max_tokens)));
  }
  return static_cast<int64_t>(max_tokens);
}

absl::StatusOr<GenerationDefaults> ParseGenerationDefaults(const nlohmann::json& config) {
  if (!config.is_object()) {
    return InvalidText("generation_config", "a JSON object", config.dump());
  }
  GenerationDefaults d;
  DI_ASSIGN_OR_RETURN(d.temperature, JsonFloat(config, "temperature", d.temperature));
  DI_ASSIGN_OR_RETURN(d.top_p, JsonFloat(config, "top_p", d.top_p));
  DI_ASSIGN_OR_RETURN(d.min_p, JsonFloat(config, "min_p", d.min_p));
  DI_ASSIGN_OR_RETURN(d.repetition_penalty,
                      JsonFloat(config, "repetition_penalty", d.repetition_penalty));
  const auto top_k = config.find("top_k");
  if (top_k != config.end() && !top_k->is_null()) {
    if (!top_k->is_number_integer() || top_k->get<int64_t>() < -1 ||
        top_k->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidText("generation_config.top_k", "-1, 0 (disabled) or >= 1", top_k->dump());
    }
    d.top_k = static_cast<int>(top_k->get<int64_t>());
  }
  if (!(d.temperature >= 0.0f) || !std::isfinite(d.temperature)) {
    return Invalid("generation_config.temperature", ">= 0", d.temperature);
  }
  if (!(d.top_p > 0.0f && d.top_p <= 1.0f)) {
    return Invalid("generation_config.top_p", "(0, 1]", d.top_p);
  }
  if (!(d.min_p >= 0.0f && d.min_p <= 1.0f)) {
    return Invalid("generation_config.min_p", "[0, 1]", d.min_p);
  }
  if (!(d.repetition_penalty > 0.0f && d.repetition_penalty <= 2.0f)) {
    return Invalid("generation_config.repetition_penalty", "(0, 2]", d.repetition_penalty);
  }
  return d;
}

absl::Status ValidateSamplingParams(const v1::SamplingParams& s, int vocab_size) {
  if (s.has_temperature() && (!(s.temperature() >= 0.0f) || !std::isfinite(s.temperature()))) {
    return Invalid("sampling.temperature", ">= 0", s.temperature());
  }
  if (s.has_top_p() && !(s.top_p() > 0.0f && s.top_p() <= 1.0f)) {
    return Invalid("sampling.top_p", "(0, 1]", s.top_p());
  }
  if (s.has_top_k() && s.top_k() < -1) {
    return Invalid("sampling.top_k", "-1, 0 (disabled) or >= 1", s.top_k());
  }
  if (s.has_min_p() && !(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return Invalid("sampling.min_p", "[0, 1]", s.min_p());
  }
  if (!(s.presence_penalty() >= -2.0f && s.presence_penalty() <= 2.0f)) {
    return Invalid("sampling.presence_penalty", "[-2, 2]", s.presence_penalty());
  }
  if (!(s.frequency_penalty() >= -2.0f && s.frequency_penalty() <= 2.0f)) {
    return Invalid("sampling.frequency_penalty", "[-2, 2]", s.frequency_penalty());
  }
  // 0 means unset.
  if (s.repetition_penalty() != 0.0f &&
      !(s.repetition_penalty() > 0.0f && s.repetition_penalty() <= 2.0f)) {
    return Invalid("sampling.repetition_penalty", "(0, 2] (0 = unset)", s.repetition_penalty());
  }
  if (s.stop_size() > kMaxStopStrings) {
    return Invalid("sampling.stop", "at most 16 strings", s.stop_size());
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string field = absl::StrCat("sampling.stop[", i, "]");
    if (s.stop(i).empty() || s.stop(i).size() > kMaxStopBytes) {
      return InvalidText(field, "1..256 bytes", absl::StrCat(s.stop(i).size(), " bytes"));
    }
    DI_RETURN_IF_ERROR(CheckUtf8(field, s.stop(i)));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    if (vocab_size <= 0 || s.stop_token_ids(i) >= static_cast<uint32_t>(vocab_size)) {
      return Invalid(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                     absl::StrCat("a token id in [0, ", vocab_size, ")"), s.stop_token_ids(i));
    }
  }
  if (s.logprobs() > kMaxLogprobs) return Invalid("sampling.logprobs", "0..20", s.logprobs());
  return absl::OkStatus();
}

absl::Status ValidateChatRequest(const v1::ChatRequest& request, const RequestLimits& limits) {
  return CheckChat(request, limits, nullptr);
}

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     const RequestLimits& limits) {
  DI_RETURN_IF_ERROR(CheckCommon(request.request_id(), request.sampling(), request.cache_salt(),
                                 request.priority(), limits.vocab_size));
  DI_RETURN_IF_ERROR(ValidatePromptTokenIds(request.prompt_token_ids(), limits.vocab_size));
  return ResolveMaxTokens(request.sampling().max_tokens(), request.prompt_token_ids_size(),
                          limits.max_context_tokens)
      .status();
}

absl::StatusOr<ChatPrompt> ConvertChatMessages(const v1::ChatRequest& request,
                                               const RequestLimits& limits) {
  ChatPrompt prompt;
  DI_RETURN_IF_ERROR(CheckChat(request, limits, &prompt));
  return prompt;
}

absl::StatusOr<engine::SamplingParams> ToEngineSamplingParams(const v1::SamplingParams& s,
                                                              const GenerationDefaults& defaults,
                                                              const RequestLimits& limits,
                                                              int64_t prompt_tokens) {
  DI_RETURN_IF_ERROR(ValidateSamplingParams(s, limits.vocab_size));
  engine::SamplingParams p;
  p.temperature = s.has_temperature() ? s.temperature() : defaults.temperature;
  p.top_p = s.has_top_p() ? s.top_p() : defaults.top_p;
  p.top_k = s.has_top_k() ? s.top_k() : defaults.top_k;
  p.min_p = s.has_min_p() ? s.min_p() : defaults.min_p;
  p.repetition_penalty =
      s.repetition_penalty() != 0.0f ? s.repetition_penalty() : defaults.repetition_penalty;
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.has_seed = s.has_seed();
  p.seed = s.seed();
  DI_ASSIGN_OR_RETURN(const int64_t max_tokens,
                      ResolveMaxTokens(s.max_tokens(), prompt_tokens, limits.max_context_tokens));
  if (max_tokens > std::numeric_limits<int>::max()) {
    return Invalid("sampling.max_tokens", absl::StrCat("at most ", std::numeric_limits<int>::max()),
                   static_cast<double>(max_tokens));
  }
  p.max_tokens = static_cast<int>(max_tokens);
  p.stop.assign(s.stop().begin(), s.stop().end());
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.logprobs = static_cast<int>(s.logprobs());
  p.return_logprobs = s.return_logprobs();
  // The final gate: also catches defaults that were built by hand rather than parsed.
  DI_RETURN_IF_ERROR(engine::ValidateSamplingParams(p, limits.vocab_size));
  return p;
}

absl::StatusOr<v1::SamplingParams> ResolveSampling(const v1::SamplingParams& sampling,
                                                   const GenerationDefaults& defaults,
                                                   const RequestLimits& limits,
                                                   int64_t prompt_tokens) {
  DI_ASSIGN_OR_RETURN(const engine::SamplingParams p,
                      ToEngineSamplingParams(sampling, defaults, limits, prompt_tokens));
  v1::SamplingParams resolved = sampling;
  resolved.set_temperature(p.temperature);
  resolved.set_top_p(p.top_p);
  resolved.set_top_k(p.top_k);
  resolved.set_min_p(p.min_p);
  resolved.set_repetition_penalty(p.repetition_penalty);
  return resolved;
}

}  // namespace deepinfer::api

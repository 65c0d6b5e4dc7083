#include "engine/vision/image_processor.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::vision {
namespace {

using json = nlohmann::json;

// --- PIL's resampling (Resample.c), re-derived from its documented algorithm -----------------

// Fixed-point precision of the 8-bit path: 32 bits minus 8 for the sample minus 2 for the
// sum's headroom.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Filter {
  double support;
  double (*fn)(double);
};

double BilinearFilter(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Keys' cubic with a = -0.5, as PIL uses.
double BicubicFilter(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

Filter FilterFor(int resample) {
  return resample == kResampleBilinear ? Filter{1.0, &BilinearFilter} : Filter{2.0, &BicubicFilter};
}

// Per output position: the first input index, the number of taps, and ksize fixed-point weights.
struct Coefficients {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  // out_size x ksize
};

Coefficients ComputeCoefficients(int in_size, int out_size, const Filter& filter) {
  const double scale = static_cast<double>(in_size) / out_size;
  // Downscaling widens the filter by the scale factor (antialiasing); upscaling does not.
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter.support * filter_scale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(size_t(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double inv_scale = 1.0 / filter_scale;
    // Truncation toward zero after adding 0.5, then clamping to the image.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = hi - lo;
    double total = 0.0;
    for (int x = 0; x < n; ++x) {
      w[x] = filter.fn((x + lo - center + 0.5) * inv_scale);
      total += w[x];
    }
    for (int x = 0; x < n; ++x) {
      if (total != 0.0) w[x] /= total;
      const double fixed = w[x] * (1 << kPrecisionBits);
      c.weights[size_t(xx) * c.ksize + x] =
          static_cast<int32_t>(w[x] < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.first[xx] = lo;
    c.count[xx] = n;
  }
  return c;
}

inline uint8_t Clip8(int64_t acc) {
  if (acc <= 0) return 0;
  if (acc >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  return static_cast<uint8_t>(acc >> kPrecisionBits);
}

// One separable pass along x (horizontal) or y (vertical) over an HWC RGB image.
std::vector<uint8_t> ResampleHorizontal(const std::vector<uint8_t>& in, int width, int height,
                                        int out_width, const Coefficients& c) {
  std::vector<uint8_t> out(size_t(out_width) * height * 3);
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = &in[size_t(y) * width * 3];
    for (int xx = 0; xx < out_width; ++xx) {
      const int32_t* k = &c.weights[size_t(xx) * c.ksize];
      int64_t acc[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1),
                        1 << (kPrecisionBits - 1)};
      for (int x = 0; x < c.count[xx]; ++x) {
        const uint8_t* px = row + size_t(c.first[xx] + x) * 3;
        acc[0] += int64_t{px[0]} * k[x];
        acc[1] += int64_t{px[1]} * k[x];
        acc[2] += int64_t{px[2]} * k[x];
      }
      uint8_t* o = &out[(size_t(y) * out_width + xx) * 3];
      o[0] = Clip8(acc[0]);
      o[1] = Clip8(acc[1]);
      o[2] = Clip8(acc[2]);
    }
  }
  return out;
}

std::vector<uint8_t> ResampleVertical(const std::vector<uint8_t>& in, int width, int out_height,
                                      const Coefficients& c) {
  std::vector<uint8_t> out(size_t(width) * out_height * 3);
  const size_t stride = size_t(width) * 3;
  for (int yy = 0; yy < out_height; ++yy) {
    const int32_t* k = &c.weights[size_t(yy) * c.ksize];
    for (size_t i = 0; i < stride; ++i) {
      int64_t acc = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < c.count[yy]; ++y) {
        acc += int64_t{in[size_t(c.first[yy] + y) * stride + i]} * k[y];
      }
      out[size_t(yy) * stride + i] = Clip8(acc);
    }
  }
  return out;
}

// transformers' convert_to_rgb for an image with alpha: PIL's alpha_composite of the image
// over opaque white. With an opaque destination the blend reduces to a 7-bit fixed-point
// weight of the source alpha and a rounded division by 255.
std::vector<uint8_t> CompositeOnWhite(const RgbImage& image) {
  constexpr int kBits = 7;
  auto div255 = [](uint32_t v) { return ((v >> 8) + v) >> 8; };
  std::vector<uint8_t> out(image.pixels.size());
  for (size_t i = 0; i < image.alpha.size(); ++i) {
    const uint32_t a = image.alpha[i];
    for (int ch = 0; ch < 3; ++ch) {
      if (a == 0) {
        out[3 * i + ch] = 255;
        continue;
      }
      const uint32_t out_a255 = a * 255 + 255 * (255 - a);
      const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / out_a255;
      const uint32_t coef2 = 255 * (1u << kBits) - coef1;
      const uint32_t v = image.pixels[3 * i + ch] * coef1 + 255 * coef2;
      out[3 * i + ch] = static_cast<uint8_t>(div255(v + (0x80u << kBits)) >> kBits);
    }
  }
  return out;
}

// --- Config ---------------------------------------------------------------------------------

absl::Status KeyError(const std::string& source, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", what));
}

absl::StatusOr<bool> GetBool(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_boolean()) return KeyError(source, key, "expected a boolean, got " + v.dump());
  return v.get<bool>();
}

absl::StatusOr<int> GetPositiveInt(const json& v, const std::string& source,
                                   const std::string& key) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > 65536) {
    return KeyError(source, key, "expected an integer in [1, 65536], got " + v.dump());
  }
  return v.get<int>();
}

absl::StatusOr<std::array<double, 3>> GetTriple(const json& v, const std::string& source,
                                                const std::string& key, bool positive) {
  std::array<double, 3> out{};
  if (v.is_number()) {
    out.fill(v.get<double>());
  } else if (v.is_array() && v.size() == 3) {
    for (int i = 0; i < 3; ++i) {
      if (!v[i].is_number()) return KeyError(source, key, "expected numbers, got " + v.dump());
      out[i] = v[i].get<double>();
    }
  } else {
    return KeyError(source, key, "expected a number or 3 numbers, got " + v.dump());
  }
  if (positive) {
    for (double d : out) {
      if (!(d > 0)) return KeyError(source, key, "expected positive values, got " + v.dump());
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ImageProcessorConfig> ParseImageProcessorConfig(const json& j,
                                                               const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(source + ": expected a JSON object");
  ImageProcessorConfig c;
  bool square_from_shortest = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "image_processor_type" || key == "feature_extractor_type") {
      static const char* kSupported[] = {"CLIPImageProcessor", "CLIPImageProcessorFast",
                                         "CLIPImageProcessorPil", "CLIPFeatureExtractor"};
      const bool ok = v.is_string() && std::any_of(std::begin(kSupported), std::end(kSupported),
                                                   [&](const char* s) { return v == s; });
      if (!ok) return KeyError(source, key, "unsupported image processor " + v.dump());
    } else if (key == "processor_class" || key == "_processor_class" || key == "auto_map" ||
               key == "return_tensors" || key == "device" || key == "disable_grouping" ||
               key == "input_data_format" || key == "default_to_square") {
      // Bookkeeping that does not change the pixels.
    } else if (key == "data_format") {
      if (!v.is_null() && v != "channels_first") {
        return KeyError(source, key, "only channels_first is supported, got " + v.dump());
      }
    } else if (key == "do_resize") {
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      c.do_resize = *b;
    } else if (key == "size") {
      if (v.is_number_integer()) {
        auto s = GetPositiveInt(v, source, key);
        if (!s.ok()) return s.status();
        c.shortest_edge = *s;
      } else if (v.is_object()) {
        c.shortest_edge = 0;
        for (const auto& [k2, v2] : v.items()) {
          const std::string name = "size." + k2;
          if (k2 == "shortest_edge" || k2 == "height" || k2 == "width") {
            if (v2.is_null()) continue;
            auto s = GetPositiveInt(v2, source, name);
            if (!s.ok()) return s.status();
            (k2 == "shortest_edge" ? c.shortest_edge
                                   : (k2 == "height" ? c.resize_height : c.resize_width)) = *s;
          } else if (!v2.is_null()) {
            return KeyError(source, name, "unsupported (only shortest_edge or height/width)");
          }
        }
        const bool hw = c.resize_height > 0 && c.resize_width > 0;
        if ((c.shortest_edge > 0) == hw || (!hw && (c.resize_height > 0 || c.resize_width > 0))) {
          return KeyError(source, key,
                          "expected shortest_edge or height and width, got " + v.dump());
        }
      } else {
        return KeyError(source, key, "expected an integer or an object, got " + v.dump());
      }
    } else if (key == "resample") {
      if (!v.is_number_integer() ||
          (v.get<int>() != kResampleBilinear && v.get<int>() != kResampleBicubic)) {
        return KeyError(source, key,
                        "only 2 (bilinear) and 3 (bicubic) are supported, got " + v.dump());
      }
      c.resample = v.get<int>();
    } else if (key == "do_center_crop") {
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      c.do_center_crop = *b;
    } else if (key == "crop_size") {
      if (v.is_number_integer()) {
        auto s = GetPositiveInt(v, source, key);
        if (!s.ok()) return s.status();
        c.crop_height = c.crop_width = *s;
      } else if (v.is_object() && v.size() == 2 && v.contains("height") && v.contains("width")) {
        auto h = GetPositiveInt(v["height"], source, "crop_size.height");
        if (!h.ok()) return h.status();
        auto w = GetPositiveInt(v["width"], source, "crop_size.width");
        if (!w.ok()) return w.status();
        c.crop_height = *h;
        c.crop_width = *w;
      } else {
        return KeyError(source, key, "expected an integer or {height, width}, got " + v.dump());
      }
    } else if (key == "do_rescale") {
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      c.do_rescale = *b;
    } else if (key == "rescale_factor") {
      if (!v.is_number() || !(v.get<double>() > 0)) {
        return KeyError(source, key, "expected a positive number, got " + v.dump());
      }
      c.rescale_factor = v.get<double>();
    } else if (key == "do_normalize") {
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      c.do_normalize = *b;
    } else if (key == "image_mean" || key == "image_std") {
      auto t = GetTriple(v, source, key, key == "image_std");
      if (!t.ok()) return t.status();
      (key == "image_mean" ? c.image_mean : c.image_std) = *t;
    } else if (key == "do_convert_rgb") {
      if (v.is_null()) continue;
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      c.do_convert_rgb = *b;
    } else if (key == "use_square_size") {
      auto b = GetBool(v, source, key);
      if (!b.ok()) return b.status();
      square_from_shortest = *b;
    } else if (key == "do_pad" || key == "crop_pct" || key == "do_flip_channel_order" ||
               key == "pad_size") {
      if (!v.is_null() && v != false) return KeyError(source, key, "unsupported setting");
    } else {
      return KeyError(source, key, "unsupported setting");
    }
  }
  if (square_from_shortest && c.shortest_edge > 0) {
    c.resize_height = c.resize_width = c.shortest_edge;
    c.shortest_edge = 0;
  }
  return c;
}

absl::StatusOr<ImageProcessorConfig> LoadImageProcessorConfig(const std::string& model_dir) {
  const std::string processor_path = model_dir + "/processor_config.json";
  auto text = ReadText(processor_path);
  if (text.ok()) {
    json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(processor_path + ": invalid JSON");
    if (j.is_object() && j.contains("image_processor")) {
      return ParseImageProcessorConfig(j["image_processor"], processor_path + ": image_processor");
    }
  }
  const std::string preprocessor_path = model_dir + "/preprocessor_config.json";
  text = ReadText(preprocessor_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(model_dir,
                                            ": neither processor_config.json with an "
                                            "\"image_processor\" object nor "
                                            "preprocessor_config.json"));
  }
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(preprocessor_path + ": invalid JSON");
  return ParseImageProcessorConfig(j, preprocessor_path);
}

std::vector<uint8_t> ResizeRgb(const std::vector<uint8_t>& pixels, int width, int height,
                               int out_width, int out_height, int resample) {
  const Filter filter = FilterFor(resample);
  std::vector<uint8_t> current = pixels;
  int w = width;
  if (out_width != width) {
    current = ResampleHorizontal(current, width, height, out_width,
                                 ComputeCoefficients(width, out_width, filter));
    w = out_width;
  }
  if (out_height != height) {
    current =
        ResampleVertical(current, w, out_height, ComputeCoefficients(height, out_height, filter));
  }
  return current;
}

std::pair<int, int> ResizedSize(int width, int height, const ImageProcessorConfig& c) {
  if (!c.do_resize) return {height, width};
  if (c.shortest_edge <= 0) return {c.resize_height, c.resize_width};
  const int shorter = std::min(width, height);
  const int longer = std::max(width, height);
  // Python: int(size * long / short), a correctly rounded division then truncation.
  const int new_long = static_cast<int>(static_cast<double>(int64_t{c.shortest_edge} * longer) /
                                        static_cast<double>(shorter));
  return width <= height ? std::pair{new_long, c.shortest_edge}
                         : std::pair{c.shortest_edge, new_long};
}

std::pair<int, int> PreprocessedSize(int width, int height, const ImageProcessorConfig& config) {
  if (config.do_center_crop) return {config.crop_height, config.crop_width};
  return ResizedSize(width, height, config);
}

std::vector<float> Preprocess(const RgbImage& image, const ImageProcessorConfig& config) {
  std::vector<uint8_t> rgb =
      config.do_convert_rgb && !image.alpha.empty() ? CompositeOnWhite(image) : image.pixels;
  int width = image.width;
  int height = image.height;
  if (config.do_resize) {
    const auto [new_h, new_w] = ResizedSize(width, height, config);
    if (new_h != height || new_w != width) {
      rgb = ResizeRgb(rgb, width, height, new_w, new_h, config.resample);
      width = new_w;
      height = new_h;
    }
  }
  int out_h = height;
  int out_w = width;
  int top = 0;  // source row of output row 0 (may be negative: zero padding)
  int left = 0;
  if (config.do_center_crop) {
    out_h = config.crop_height;
    out_w = config.crop_width;
    // transformers crops at floor((size - crop) / 2); an image smaller than the crop is first
    // zero-padded by ceil((crop - size) / 2) before it, which puts the source at this offset.
    top = height >= out_h ? (height - out_h) / 2 : -((out_h - height + 1) / 2);
    left = width >= out_w ? (width - out_w) / 2 : -((out_w - width + 1) / 2);
  }
  const float mean[3] = {static_cast<float>(config.image_mean[0]),
                         static_cast<float>(config.image_mean[1]),
                         static_cast<float>(config.image_mean[2])};
  const float std_dev[3] = {static_cast<float>(config.image_std[0]),
                            static_cast<float>(config.image_std[1]),
                            static_cast<float>(config.image_std[2])};
  std::vector<float> out(size_t(3) * out_h * out_w);
  for (int y = 0; y < out_h; ++y) {
    const int sy = y + top;
    for (int x = 0; x < out_w; ++x) {
      const int sx = x + left;
      const bool inside = sy >= 0 && sy < height && sx >= 0 && sx < width;
      for (int ch = 0; ch < 3; ++ch) {
        const uint8_t v = inside ? rgb[(size_t(sy) * width + sx) * 3 + ch] : 0;
        float f = config.do_rescale
                      ? static_cast<float>(static_cast<double>(v) * config.rescale_factor)
                      : static_cast<float>(v);
        if (config.do_normalize) f = (f - mean[ch]) / std_dev[ch];
        out[(size_t(ch) * out_h + y) * out_w + x] = f;
      }
    }
  }
  return out;
}

}  // namespace deepinfer::engine::vision

// Decoding of request images (PNG, JPEG) into 8-bit RGB, the input of the vision preprocessor.
//
// The format is decided by content (magic bytes), never by a name or MIME type:
//   PNG  (libpng): every colour type and bit depth: grey, grey+alpha, palette, RGB, RGBA, 1..16
//        bits. Sub-8-bit samples are expanded, 16-bit samples are scaled to 8 bits with rounding
//        (round(v * 255 / 65535)), grey is replicated to R=G=B, palettes are looked up.
//        Interlaced images are supported. Gamma/colour-profile chunks are ignored (as PIL does).
//   JPEG (libjpeg-turbo's TurboJPEG): baseline, progressive, greyscale (replicated to RGB), with
//        the accurate integer IDCT and fancy upsampling (libjpeg's defaults, which Pillow uses).
//        CMYK/YCCK JPEGs are refused. EXIF orientation is not applied (neither does PIL's
//        Image.open nor transformers' processors given a PIL image).
// `pixels` holds the colour channels with any alpha dropped, exactly like PIL's convert("RGB");
// the alpha channel (or the transparency a tRNS chunk defines) is kept separately in `alpha`
// so that a preprocessor can composite onto white as transformers' convert_to_rgb does.
//
// Errors are kInvalidArgument with a message without a field path (callers prefix one):
// "empty image", "not a PNG or JPEG image", "truncated PNG data", "image of 70000x70000 pixels
// exceeds the limit of 36000000", "image of 30000000 bytes exceeds the limit of 20971520 bytes",
// "invalid PNG data: <libpng's reason>", "invalid JPEG data: <libjpeg's reason>". Decoding never
// crashes on malformed input, and the dimensions a header claims are checked against the limits
// before any buffer of that size is allocated.
//
// Thread-safety: DecodeImage is reentrant and thread-safe (no shared state).
#ifndef DEEPINFER_ENGINE_VISION_IMAGE_DECODE_H_
#define DEEPINFER_ENGINE_VISION_IMAGE_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::engine::vision {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3 (HWC), RGB, 8-bit
  // height x width alpha samples (255 = opaque) when the source has an alpha channel or tRNS
  // transparency; empty otherwise.
  std::vector<uint8_t> alpha;
};

struct ImageLimits {
  int64_t max_bytes = 20 << 20;        // encoded size
  int64_t max_pixels = 6000LL * 6000;  // width * height
};

enum class ImageFormat { kUnknown, kPng, kJpeg };

// The format `bytes` start with (magic bytes only; the rest is not validated).
ImageFormat SniffImageFormat(absl::string_view bytes);

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const ImageLimits& limits = {});

}  // namespace deepinfer::engine::vision

#endif  // DEEPINFER_ENGINE_VISION_IMAGE_DECODE_H_

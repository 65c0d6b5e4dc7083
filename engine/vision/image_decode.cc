#include "engine/vision/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::engine::vision {
namespace {

constexpr unsigned char kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

absl::Status PixelLimitError(int64_t width, int64_t height, const ImageLimits& limits) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image of ", width, "x", height, " pixels has no pixels"));
  }
  if (width * height > limits.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", width, "x", height, " pixels exceeds the limit of ", limits.max_pixels));
  }
  return absl::OkStatus();
}

uint32_t ReadBigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// --- PNG -----------------------------------------------------------------------------------

// State shared with libpng's callbacks. libpng reports errors by longjmp, so everything with a
// destructor lives here, outside the frame that calls setjmp.
struct PngReader {
  absl::string_view data;
  size_t offset = 0;
  std::string error;
  std::vector<uint8_t> decoded;  // height x rowbytes after transforms
  std::vector<png_bytep> rows;
};

void PngError(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  if (reader->error.empty()) reader->error = message;
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (length > reader->data.size() - reader->offset) {
    reader->error = "truncated PNG data";
    png_longjmp(png, 1);
  }
  std::memcpy(out, reader->data.data() + reader->offset, length);
  reader->offset += length;
}

// Decodes into reader->decoded as 8-bit RGB or RGBA (*channels). Returns false with
// reader->error set on failure. Only trivially destructible locals: libpng may longjmp out of
// any call below.
bool DecodePngRaw(PngReader* reader, const ImageLimits* limits, png_uint_32* width_out,
                  png_uint_32* height_out, int* channels_out) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, reader, &PngError, &PngWarning);
  if (png == nullptr) {
    reader->error = "out of memory";
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    reader->error = "out of memory";
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, reader, &PngRead);
  // Bound what ancillary chunks may allocate (text, ICC profiles): 1 MiB is plenty.
  png_set_chunk_malloc_max(png, 1 << 20);
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_DEFAULT);
  png_read_info(png, info);

  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  if (int64_t{width} * int64_t{height} > limits->max_pixels) {
    reader->error = "limit";
    png_destroy_read_struct(&png, &info, nullptr);
    *width_out = width;
    *height_out = height;
    return false;
  }
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (bit_depth == 16) png_set_scale_16(png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);

  const int channels = png_get_channels(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  if ((channels != 3 && channels != 4) || png_get_bit_depth(png, info) != 8 ||
      rowbytes != size_t{width} * channels) {
    reader->error = "unexpected PNG layout after conversion";
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  reader->decoded.resize(rowbytes * height);
  reader->rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) reader->rows[y] = &reader->decoded[rowbytes * y];
  png_read_image(png, reader->rows.data());
  png_destroy_read_struct(&png, &info, nullptr);
  *width_out = width;
  *height_out = height;
  *channels_out = channels;
  return true;
}

absl::StatusOr<RgbImage> DecodePng(absl::string_view bytes, const ImageLimits& limits) {
  // IHDR is the first chunk: 8 magic + 4 length + "IHDR" + width + height. Checking the claimed
  // size here refuses huge images before libpng allocates anything for them.
  if (bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    const uint32_t width = ReadBigEndian32(p + 16);
    const uint32_t height = ReadBigEndian32(p + 20);
    if (width > 0 && height > 0 && int64_t{width} * int64_t{height} > limits.max_pixels) {
      return PixelLimitError(width, height, limits);
    }
  }
  PngReader reader;
  reader.data = bytes;
  png_uint_32 width = 0;
  png_uint_32 height = 0;
  int channels = 0;
  if (!DecodePngRaw(&reader, &limits, &width, &height, &channels)) {
    if (reader.error == "limit") return PixelLimitError(width, height, limits);
    if (reader.error == "truncated PNG data") return absl::InvalidArgumentError(reader.error);
    return absl::InvalidArgumentError(absl::StrCat("invalid PNG data: ", reader.error));
  }
  RgbImage image;
  image.width = static_cast<int>(width);
  image.height = static_cast<int>(height);
  const size_t count = size_t{width} * height;
  if (channels == 3) {
    image.pixels = std::move(reader.decoded);
    return image;
  }
  image.pixels.resize(count * 3);
  image.alpha.resize(count);
  for (size_t i = 0; i < count; ++i) {
    image.pixels[3 * i + 0] = reader.decoded[4 * i + 0];
    image.pixels[3 * i + 1] = reader.decoded[4 * i + 1];
    image.pixels[3 * i + 2] = reader.decoded[4 * i + 2];
    image.alpha[i] = reader.decoded[4 * i + 3];
  }
  return image;
}

// --- JPEG ----------------------------------------------------------------------------------

class TjHandle {
 public:
  TjHandle() : handle_(tjInitDecompress()) {}
  ~TjHandle() {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle get() const { return handle_; }

 private:
  tjhandle handle_;
};

absl::Status JpegError(tjhandle handle) {
  const std::string message = tjGetErrorStr2(handle);
  if (absl::StrContains(message, "Premature end") || absl::StrContains(message, "premature end")) {
    return absl::InvalidArgumentError("truncated JPEG data");
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid JPEG data: ", message));
}

absl::StatusOr<RgbImage> DecodeJpeg(absl::string_view bytes, const ImageLimits& limits) {
  TjHandle handle;
  if (handle.get() == nullptr) return absl::InternalError("tjInitDecompress failed");
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int width = 0;
  int height = 0;
  int subsampling = 0;
  int colorspace = 0;
  if (tjDecompressHeader3(handle.get(), data, size, &width, &height, &subsampling, &colorspace) !=
      0) {
    return JpegError(handle.get());
  }
  if (absl::Status s = PixelLimitError(width, height, limits); !s.ok()) return s;
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return absl::InvalidArgumentError("CMYK JPEG images are not supported");
  }
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(size_t(width) * height * 3);
  // Flags 0: accurate integer IDCT and fancy upsampling, libjpeg's defaults.
  if (tjDecompress2(handle.get(), data, size, image.pixels.data(), width, 0, height, TJPF_RGB, 0) !=
      0) {
    // Warnings (e.g. extraneous bytes before a marker) leave a complete image, as in PIL;
    // a premature end of data does not.
    if (tjGetErrorCode(handle.get()) != TJERR_WARNING ||
        absl::StrContains(tjGetErrorStr2(handle.get()), "Premature end")) {
      return JpegError(handle.get());
    }
  }
  return image;
}

}  // namespace

ImageFormat SniffImageFormat(absl::string_view bytes) {
  if (bytes.size() >= sizeof(kPngMagic) &&
      std::memcmp(bytes.data(), kPngMagic, sizeof(kPngMagic)) == 0) {
    return ImageFormat::kPng;
  }
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
      static_cast<unsigned char>(bytes[1]) == 0xD8 &&
      static_cast<unsigned char>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const ImageLimits& limits) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty image");
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", bytes.size(), " bytes exceeds the limit of ", limits.max_bytes, " bytes"));
  }
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng:
      return DecodePng(bytes, limits);
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, limits);
    case ImageFormat::kUnknown:
      break;
  }
  return absl::InvalidArgumentError("not a PNG or JPEG image");
}

}  // namespace deepinfer::engine::vision

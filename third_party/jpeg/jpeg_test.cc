// Proves libjpeg-turbo links: compresses a small gradient in memory and
// decompresses it back, close to the original (JPEG is lossy).
#include <cstdio>
#include <cstdlib>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "gtest/gtest.h"

namespace {

TEST(JpegTest, CompressesAndDecompressesInMemory) {
  const int w = 64, h = 48;
  std::vector<unsigned char> rgb(w * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      rgb[(y * w + x) * 3 + 0] = static_cast<unsigned char>(x * 4);
      rgb[(y * w + x) * 3 + 1] = static_cast<unsigned char>(y * 5);
      rgb[(y * w + x) * 3 + 2] = 128;
    }
  }
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  jpeg_mem_dest(&c, &out, &out_size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = &rgb[c.next_scanline * w * 3];
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  ASSERT_GT(out_size, 0u);

  jpeg_decompress_struct d;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, out, out_size);
  ASSERT_EQ(jpeg_read_header(&d, TRUE), JPEG_HEADER_OK);
  jpeg_start_decompress(&d);
  ASSERT_EQ(static_cast<int>(d.output_width), w);
  ASSERT_EQ(static_cast<int>(d.output_height), h);
  std::vector<unsigned char> back(w * h * 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = &back[d.output_scanline * w * 3];
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  std::free(out);
  double error = 0;
  for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(int(rgb[i]) - int(back[i]));
  EXPECT_LT(error / rgb.size(), 3.0);
}

}  // namespace

#include "data/testing.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

namespace ember::data::testing {

std::string EncodeJpeg(int w, int h, const std::function<std::array<int, 3>(int, int)>& f,
                       bool gray) {
  const int comps = gray ? 1 : 3;
  std::vector<unsigned char> pixels(w * h * comps);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const std::array<int, 3> v = f(x, y);
      for (int c = 0; c < comps; ++c) pixels[(y * w + x) * comps + c] = v[c];
    }
  }
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = comps;
  c.in_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = &pixels[c.next_scanline * w * comps];
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string bytes(reinterpret_cast<char*>(out), size);
  std::free(out);
  return bytes;
}

}  // namespace ember::data::testing

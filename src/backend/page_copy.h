// PageCopy: one page's move between two page pools (the device pool and the host tier's), as device_memory.h's
// copy_pages takes them.
#pragma once

namespace se {

struct PageCopy {
  void* dst;
  const void* src;
};

}  // namespace se

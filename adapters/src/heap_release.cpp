#include "joule/adapters/heap_release.hpp"

#include <malloc.h>

namespace joule::adapters {

HeapUsage heap_usage() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 info = ::mallinfo2();
  return HeapUsage{info.uordblks + info.hblkhd, info.fordblks};
#else
  return {};
#endif
}

bool release_free_heap() {
#if defined(__GLIBC__)
  return ::malloc_trim(0) != 0;
#else
  return false;
#endif
}

}  // namespace joule::adapters

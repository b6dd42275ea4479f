# Writes a C++ source whose function NAMESPACE::FUNCTION() returns the bytes of INPUT as a
# std::string_view: how daemon/assets/status.html gets into jouled. Bytes, not a raw string
# literal, so nothing in the file (a ")" followed by the delimiter, a NUL) can break the source.
# cmake -DINPUT=... -DOUTPUT=... -DNAMESPACE=... -DFUNCTION=... -P embed_file.cmake
foreach(variable INPUT OUTPUT NAMESPACE FUNCTION)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "embed_file.cmake: -D${variable}=... is missing")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
if(hex_length EQUAL 0)
  message(FATAL_ERROR "embed_file.cmake: ${INPUT} is empty")
endif()
# 0x3c,0x21,... twenty bytes a line.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){20})" "\\1\n    " bytes "${bytes}")
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp"
"// Generated from ${name} by daemon/cmake/embed_file.cmake at build time; do not edit.
#include <string_view>

namespace ${NAMESPACE} {
namespace {
const unsigned char kBytes[] = {
    ${bytes}};
}  // namespace

std::string_view ${FUNCTION}() { return {reinterpret_cast<const char*>(kBytes), sizeof kBytes}; }

}  // namespace ${NAMESPACE}
")
# Only a changed file is rewritten, so an unchanged page recompiles nothing.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")

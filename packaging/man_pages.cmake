# joule_man_page(TARGET): the program's man page, generated from its own command tree
# (`PROGRAM --man-page`, cli/include/joule/cli/command_docs.hpp) each time the program is linked,
# so that it always matches the binary beside it, and installed in share/man/man1. Compressed
# with gzip -9n as Debian wants (no name or time stamp: builds are reproducible). Included by the
# programs' own directories, since a POST_BUILD step must be added where its target is defined.
function(joule_man_page target)
  set(page ${PROJECT_BINARY_DIR}/man/${target}.1.gz)
  # A cross build runs the program under its emulator (CMAKE_CROSSCOMPILING_EMULATOR: qemu-aarch64
  # for cmake/arm64-linux-gnu.cmake); natively the emulator is empty.
  add_custom_command(TARGET ${target} POST_BUILD
                     COMMAND bash -o pipefail -c "mkdir -p \"$(dirname \"$1\")\" && \"\${@:2}\" --man-page | gzip -9n >\"$1\""
                             joule-man-page ${page} ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:${target}>
                     VERBATIM)
  install(FILES ${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endfunction()

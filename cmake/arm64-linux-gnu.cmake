# Cross-compiling Joule for Debian 12 arm64 (Raspberry Pi 4/5, Jetson) on an amd64 machine, with
# Debian's cross compiler (crossbuild-essential-arm64) and a sysroot of Debian's arm64 packages
# (scripts/cross-arm64.sh makes both). Programs the build runs itself (the man pages, joulectl's
# completion) run under qemu user emulation.
#
#   cmake -S . -B build-arm64/build -DCMAKE_TOOLCHAIN_FILE=cmake/arm64-linux-gnu.cmake \
#         -DJOULE_ARM64_SYSROOT=/abs/path/to/sysroot
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# The toolchain file is read again for try_compile projects, which see only the environment.
if(JOULE_ARM64_SYSROOT)
  set(ENV{JOULE_ARM64_SYSROOT} "${JOULE_ARM64_SYSROOT}")
else()
  set(JOULE_ARM64_SYSROOT "$ENV{JOULE_ARM64_SYSROOT}")
endif()
if(NOT IS_DIRECTORY "${JOULE_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu")
  message(FATAL_ERROR "JOULE_ARM64_SYSROOT='${JOULE_ARM64_SYSROOT}' is not a Debian arm64 sysroot "
                      "(no usr/lib/aarch64-linux-gnu): scripts/cross-arm64.sh makes one")
endif()
set(CMAKE_SYSROOT "${JOULE_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH "${JOULE_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config reads the sysroot's .pc files and prefixes their paths with it.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${JOULE_ARM64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR} "${JOULE_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${JOULE_ARM64_SYSROOT}/usr/share/pkgconfig")

# -L: the emulated program's dynamic loader and libraries come from the sysroot.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L "${JOULE_ARM64_SYSROOT}")

# The Debian package is for arm64, whatever `dpkg --print-architecture` says here.
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)

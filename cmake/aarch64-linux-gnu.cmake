# Cross-compiling dspark for aarch64 Linux from an x86-64 Debian host
# (make test-arm): Debian's cross compiler (g++-aarch64-linux-gnu), the arm64
# sysroot that scripts/setup_arm.sh unpacks, and qemu-user running what the
# build runs for its tests (gtest_discover_tests, add_test, ctest).
#
#   cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         [-DDSPARK_ARM64_SYSROOT=DIR]
#
# DSPARK_ARM64_SYSROOT defaults to the environment variable of that name, then
# to scripts/setup_arm.sh's default, $DSPARK_HOME/arm64-sysroot (DSPARK_HOME
# defaulting to ~/.cache/dspark). The test binaries run under
# `qemu-aarch64 -cpu max` (NEON, dot product and int8 matrix multiply).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

if(NOT DSPARK_ARM64_SYSROOT)
  if(DEFINED ENV{DSPARK_ARM64_SYSROOT})
    set(DSPARK_ARM64_SYSROOT $ENV{DSPARK_ARM64_SYSROOT})
  elseif(DEFINED ENV{DSPARK_HOME})
    set(DSPARK_ARM64_SYSROOT $ENV{DSPARK_HOME}/arm64-sysroot)
  else()
    set(DSPARK_ARM64_SYSROOT $ENV{HOME}/.cache/dspark/arm64-sysroot)
  endif()
endif()
if(NOT EXISTS ${DSPARK_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/cmake/Torch/TorchConfig.cmake)
  message(FATAL_ERROR "DSPARK_ARM64_SYSROOT=${DSPARK_ARM64_SYSROOT}: expected an arm64 sysroot holding "
                      "usr/lib/aarch64-linux-gnu/cmake/Torch/TorchConfig.cmake; run scripts/setup_arm.sh")
endif()
# try_compile projects read this file again: hand them the same sysroot.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DSPARK_ARM64_SYSROOT)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT ${DSPARK_ARM64_SYSROOT})
# Libraries, headers and package configurations from the sysroot only; build
# tools (pkg-config, qemu) from the host.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_SYSROOT_DIR} ${DSPARK_ARM64_SYSROOT})
set(ENV{PKG_CONFIG_LIBDIR}
    ${DSPARK_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${DSPARK_ARM64_SYSROOT}/usr/share/pkgconfig)

find_program(DSPARK_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${DSPARK_QEMU_AARCH64} -cpu max -L ${DSPARK_ARM64_SYSROOT})

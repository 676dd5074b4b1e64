# The AArch64 cross build of aarch64-linux-gnu.cmake compiled by clang instead of GCC (Debian's
# clang, with the GCC cross toolchain's headers and libraries): the compiler family of Apple's
# toolchain, whose macOS build cannot run here. Used by scripts/test_aarch64.sh.
include(${CMAKE_CURRENT_LIST_DIR}/aarch64-linux-gnu.cmake)
set(CMAKE_C_COMPILER clang)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_CXX_COMPILER clang++)
set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)

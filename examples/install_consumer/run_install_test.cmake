# Installs anyattn and builds consumers against the installed copy. Run by ctest as
#   cmake -DMODE=<install|cmake|pkgconfig> -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=...
#         -DCONFIG=... -DGENERATOR=... -DMAKE_PROGRAM=... -DC_COMPILER=... -DCXX_COMPILER=...
#         -P run_install_test.cmake
# MODE=install    cmake --install BUILD_DIR --prefix WORK_DIR/prefix (from a clean prefix).
# MODE=cmake      configures, builds and runs examples/install_consumer with find_package(anyattn
#                 CONFIG REQUIRED) and CMAKE_PREFIX_PATH=WORK_DIR/prefix, and checks that the
#                 package was found in that prefix.
# MODE=pkgconfig  compiles install_consumer/main.cpp (C++) and examples/c_basic.c (C) with the
#                 flags of `pkg-config --cflags --libs anyattn`, PKG_CONFIG_PATH pointing into the
#                 prefix, and runs both.
cmake_minimum_required(VERSION 3.20)

set(prefix "${WORK_DIR}/prefix")
set(consumer_src "${SOURCE_DIR}/examples/install_consumer")
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs a command; on failure prints its output and fails the test.
function(run_checked what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok\n${out}")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${prefix}")
  run_checked("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}"
              --config "${CONFIG}")
  foreach(f include/anyattn/anyattn.h include/anyattn/anyattn.hpp)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "install did not produce ${prefix}/${f}")
    endif()
  endforeach()

elseif(MODE STREQUAL "cmake")
  set(build "${WORK_DIR}/cmake_consumer")
  file(REMOVE_RECURSE "${build}")
  set(configure "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${build}" -G "${GENERATOR}"
      "-DCMAKE_BUILD_TYPE=${CONFIG}" "-DCMAKE_PREFIX_PATH=${prefix}"
      "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  if(MAKE_PROGRAM)
    list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()
  run_checked("configure consumer" ${configure})
  file(STRINGS "${build}/CMakeCache.txt" found_dir REGEX "^anyattn_DIR:")
  string(FIND "${found_dir}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "find_package(anyattn) did not use the installed prefix: ${found_dir}")
  endif()
  run_checked("build consumer" "${CMAKE_COMMAND}" --build "${build}" --config "${CONFIG}")
  foreach(exe consumer_shared consumer_static)
    file(GLOB_RECURSE bins "${build}/${exe}" "${build}/${exe}.exe" "${build}/*/${exe}.exe")
    if(NOT bins)
      message(FATAL_ERROR "consumer executable ${exe} was not built")
    endif()
    list(GET bins 0 bin)
    run_checked("run ${exe}" "${bin}")
  endforeach()

elseif(MODE STREQUAL "pkgconfig")
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf REQUIRED)
  file(GLOB_RECURSE pc_files "${prefix}/*/anyattn.pc")
  if(NOT pc_files)
    message(FATAL_ERROR "no anyattn.pc under ${prefix}")
  endif()
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  run_checked("pkg-config --cflags --libs" "${PKG_CONFIG_EXECUTABLE}" --cflags --libs anyattn)
  string(STRIP "${run_output}" flags_string)
  separate_arguments(flags UNIX_COMMAND "${flags_string}")
  run_checked("pkg-config libdir" "${PKG_CONFIG_EXECUTABLE}" --variable=libdir anyattn)
  string(STRIP "${run_output}" libdir)
  file(REAL_PATH "${libdir}" libdir_real)
  file(REAL_PATH "${prefix}" prefix_real)
  string(FIND "${libdir_real}" "${prefix_real}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "anyattn.pc points outside the install prefix: libdir=${libdir}")
  endif()
  set(out "${WORK_DIR}/pkgconfig_consumer")
  file(REMOVE_RECURSE "${out}")
  file(MAKE_DIRECTORY "${out}")
  run_checked("compile C++ consumer" "${CXX_COMPILER}" -std=c++17 "${consumer_src}/main.cpp"
              -o "${out}/consumer_cpp" ${flags} "-Wl,-rpath,${libdir}")
  run_checked("compile C consumer" "${C_COMPILER}" -std=c99 "${SOURCE_DIR}/examples/c_basic.c"
              -o "${out}/consumer_c" ${flags} -lm "-Wl,-rpath,${libdir}")
  run_checked("run C++ consumer" "${out}/consumer_cpp")
  run_checked("run C consumer" "${out}/consumer_c")

else()
  message(FATAL_ERROR "MODE must be install, cmake or pkgconfig; got '${MODE}'")
endif()

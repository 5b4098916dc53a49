# Install libdsqwen into a scratch prefix, then build and run two consumers:
# one with `pkg-config --cflags --libs dsqwen`, one with find_package(dsqwen).
# Also checks that the generated dsqwen.pc is right for an absolute
# CMAKE_INSTALL_LIBDIR.  Invoked by ctest with -DSRC -DBIN -DWORK -DDATA.
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
set(PREFIX ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BIN} --prefix ${PREFIX})
foreach(f include/dsqwen.h)
  if(NOT EXISTS ${PREFIX}/${f})
    message(FATAL_ERROR "missing after install: ${f}")
  endif()
endforeach()
file(GLOB_RECURSE pcs ${PREFIX}/*/dsqwen.pc)
list(GET pcs 0 pc)
get_filename_component(pcdir ${pc} DIRECTORY)
get_filename_component(libdir ${pcdir} DIRECTORY)

# 1. pkg-config consumer
set(ENV{PKG_CONFIG_PATH} ${pcdir})
run(pkg-config --cflags --libs dsqwen)
string(STRIP "${LAST_OUT}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
message(STATUS "pkg-config: ${flags}")
run(cc -std=c99 -o ${WORK}/consumer_pc ${SRC}/tests/install/consumer.c ${flags} -lm -Wl,-rpath,${libdir})
run(${WORK}/consumer_pc ${DATA}/tiny)
message(STATUS "${LAST_OUT}")

# 2. find_package consumer
run(${CMAKE_COMMAND} -S ${SRC}/tests/install/cmake_consumer -B ${WORK}/cm
    -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_RPATH=${libdir})
run(${CMAKE_COMMAND} --build ${WORK}/cm)
run(${WORK}/cm/consumer_cmake ${DATA}/tiny)
message(STATUS "${LAST_OUT}")

# 3. the installed CLI runs as installed: no LD_LIBRARY_PATH (its RUNPATH is
# $ORIGIN-relative), no source-tree path in its data, and it still works after
# the whole prefix moves elsewhere
set(ENV{LD_LIBRARY_PATH} "")
unset(ENV{LD_LIBRARY_PATH})
set(cli ${PREFIX}/bin/dsqwen)
run(${cli} --version)
message(STATUS "${LAST_OUT}")
run(${cli} generate --model ${DATA}/tiny --backend cpu --tokens 1,2,3 --max-tokens 2)
run(readelf -d ${cli})
if(NOT LAST_OUT MATCHES "RUNPATH[^\n]*\\[\\$ORIGIN/")
  message(FATAL_ERROR "installed dsqwen has no $ORIGIN RUNPATH:\n${LAST_OUT}")
endif()
run(objcopy -O binary --only-section=.rodata ${cli} ${WORK}/cli.rodata)
file(READ ${WORK}/cli.rodata rodata)
string(FIND "${rodata}" "${SRC}" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "installed dsqwen has the source path ${SRC} compiled in")
endif()
file(RENAME ${PREFIX} ${WORK}/moved)
run(${WORK}/moved/bin/dsqwen --version)
file(RENAME ${WORK}/moved ${PREFIX})

# 4. no RUNPATH in the build tree or the install has an empty entry (which
# the loader reads as the current directory)
file(GLOB_RECURSE installed_libs ${PREFIX}/*/libdsqwen.so*)
file(GLOB build_libs ${BIN}/libdsqwen.so*)
foreach(f ${build_libs} ${BIN}/examples/dsqwen ${BIN}/examples/install/dsqwen ${cli}
        ${installed_libs})
  if(EXISTS ${f} AND NOT IS_SYMLINK ${f})
    run(readelf -d ${f})
    string(REGEX MATCH "R(UN)?PATH[^\n]*\\[([^\n]*)\\]" rp "${LAST_OUT}")
    set(rp "${CMAKE_MATCH_2}")
    if(rp MATCHES "^:|::|:$")
      message(FATAL_ERROR "${f}: RUNPATH '${rp}' has an empty entry (= the current directory)")
    endif()
    message(STATUS "${f}: RUNPATH '${rp}'")
  endif()
endforeach()

# 5. absolute CMAKE_INSTALL_LIBDIR gives a .pc without a doubled prefix
run(${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/abs -DDSQ_CUDA=OFF -DDSQ_BUILD_TESTS=OFF
    -DDSQ_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=/opt/dsq -DCMAKE_INSTALL_LIBDIR=/opt/dsq/lib64abs)
file(READ ${WORK}/abs/dsqwen.pc pctext)
if(NOT pctext MATCHES "libdir=/opt/dsq/lib64abs\n" OR pctext MATCHES "/opt/dsq//opt")
  message(FATAL_ERROR "bad dsqwen.pc for absolute libdir:\n${pctext}")
endif()
message(STATUS "install test passed")

# Install rules: shared libraries (versioned SONAME) and static ones, headers under
# include/shardckpt/<folder>/, the CMake package (find_package(shardckpt CONFIG): shardckpt::<name>
# for the shared library, shardckpt::<name>_static for the static one), shardckpt.pc, the CLI and
# the docs.
#
# The libraries of this tree are static (what the tests and benchmarks link, as before). Each one
# gets a shared twin linked from the same object files, so nothing is compiled twice: it lists the
# same dependencies, with the tree's own libraries replaced by their shared twins.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHARDCKPT_LIBRARIES shardckpt_io shardckpt_communicator shardckpt_collectives shardckpt_model
    shardckpt_formats shardckpt_engine)
if(TARGET shardckpt_torch)
  set(SHARDCKPT_TORCH_LIBRARIES shardckpt_torch)
endif()

# Sanitizer and fuzz builds are for tests only; they install nothing.
if(SHARDCKPT_SANITIZE OR SHARDCKPT_FUZZ)
  return()
endif()

function(shardckpt_shared_twin lib)
  string(REPLACE "shardckpt_" "" short ${lib})
  get_target_property(all ${lib} LINK_LIBRARIES)
  get_target_property(public ${lib} INTERFACE_LINK_LIBRARIES)
  if(NOT all)
    set(all "")
  endif()
  if(NOT public)
    set(public "")
  endif()
  set(twin_public "")
  set(twin_private "")
  foreach(dep ${all})
    set(mapped ${dep})
    if(dep IN_LIST SHARDCKPT_LIBRARIES OR dep IN_LIST SHARDCKPT_TORCH_LIBRARIES)
      set(mapped ${dep}_shared)
    endif()
    if(dep IN_LIST public)
      list(APPEND twin_public ${mapped})
    else()
      list(APPEND twin_private ${mapped})
    endif()
  endforeach()
  add_library(${lib}_shared SHARED $<TARGET_OBJECTS:${lib}>)
  target_link_libraries(${lib}_shared PUBLIC ${twin_public} PRIVATE ${twin_private})
  foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(value ${lib} ${property})
    if(value)
      set_property(TARGET ${lib}_shared PROPERTY ${property} "${value}")
    endif()
  endforeach()
  # The tree's libraries find each other next to themselves once installed.
  set_target_properties(${lib}_shared PROPERTIES OUTPUT_NAME ${lib} EXPORT_NAME ${short}
                        VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                        INSTALL_RPATH "$ORIGIN")
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short}_static)
  add_library(shardckpt::${short} ALIAS ${lib}_shared)
  add_library(shardckpt::${short}_static ALIAS ${lib})
endfunction()

foreach(lib ${SHARDCKPT_LIBRARIES} ${SHARDCKPT_TORCH_LIBRARIES})
  shardckpt_shared_twin(${lib})
endforeach()

list(TRANSFORM SHARDCKPT_LIBRARIES APPEND _shared OUTPUT_VARIABLE shared_libraries)
install(TARGETS ${SHARDCKPT_LIBRARIES} ${shared_libraries} EXPORT shardckptTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT shardckptTargets NAMESPACE shardckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardckpt)
# The libtorch adapter is its own export set: the package loads it only where Torch is found.
if(SHARDCKPT_TORCH_LIBRARIES)
  install(TARGETS shardckpt_torch shardckpt_torch_shared EXPORT shardckptTorchTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT shardckptTorchTargets NAMESPACE shardckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardckpt)
endif()

# Headers: every library folder's, less those whose dependency this build does not have.
set(header_excludes "")
if(NOT SHARDCKPT_TORCH_LIBRARIES)
  list(APPEND header_excludes PATTERN torch_adapter.h EXCLUDE)
endif()
if(NOT SHARDCKPT_HAVE_NCCL)
  list(APPEND header_excludes PATTERN nccl_communicator.h EXCLUDE)
endif()
if(NOT SHARDCKPT_HAVE_CUDA)
  list(APPEND header_excludes PATTERN cuda_device_scope.h EXCLUDE)
endif()
foreach(folder ${SHARDCKPT_LIBRARY_FOLDERS})
  install(DIRECTORY ${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/shardckpt/${folder}
          FILES_MATCHING PATTERN "*.h" ${header_excludes})
endforeach()

# The CMake package.
set(SHARDCKPT_PACKAGE_HAVE_CUDA ${SHARDCKPT_HAVE_CUDA})
get_filename_component(SHARDCKPT_PACKAGE_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
configure_package_config_file(cmake/shardckptConfig.cmake.in ${PROJECT_BINARY_DIR}/shardckptConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardckpt)
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardckptConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardckptConfig.cmake ${PROJECT_BINARY_DIR}/shardckptConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shardckpt)

# pkg-config: the MPI flags are the ones this tree was built with (MPI implementations do not
# agree on a .pc name).
list(JOIN MPI_CXX_INCLUDE_DIRS " -I" mpi_cflags)
if(mpi_cflags)
  set(mpi_cflags "-I${mpi_cflags}")
endif()
list(JOIN MPI_CXX_LIBRARIES " " SHARDCKPT_PC_MPI_LIBS)
set(SHARDCKPT_PC_MPI_CFLAGS ${mpi_cflags})
set(SHARDCKPT_PC_EXTRA_CFLAGS "")
set(SHARDCKPT_PC_PRIVATE_LIBS "")
if(SHARDCKPT_HAVE_CUDA)
  # The installed io/cuda_device_scope.h includes cuda_runtime.h: its folder, where it is not
  # a compiler default.
  string(APPEND SHARDCKPT_PC_EXTRA_CFLAGS " -DSHARDCKPT_HAVE_CUDA=1")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(NOT dir STREQUAL "/usr/include")
      string(APPEND SHARDCKPT_PC_EXTRA_CFLAGS " -I${dir}")
    endif()
  endforeach()
  string(APPEND SHARDCKPT_PC_PRIVATE_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(SHARDCKPT_HAVE_NCCL)
  string(APPEND SHARDCKPT_PC_EXTRA_CFLAGS " -DSHARDCKPT_HAVE_NCCL=1")
  string(APPEND SHARDCKPT_PC_PRIVATE_LIBS " ${NCCL_LIBRARY}")
endif()
# Relocatable: the prefix is found from the .pc file's own place, so `cmake --install --prefix P`
# anywhere gives a working file.
file(RELATIVE_PATH SHARDCKPT_PC_PREFIX_FROM_PCFILEDIR /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" SHARDCKPT_PC_PREFIX_FROM_PCFILEDIR "${SHARDCKPT_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(cmake/shardckpt.pc.in ${PROJECT_BINARY_DIR}/shardckpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/shardckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS shardckpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

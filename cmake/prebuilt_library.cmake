# Tests only (tests/pip_install_test.sh, tests/source_consumer_test.sh): the library as
# another build tree of these sources against the same torch version built it (make
# check's), so that pip compiles only the extension and the command, and a source consumer
# only itself. A user's build compiles it all: with MIXTRAIN_PREBUILT_LIBRARY empty this
# file defines nothing, and CMakeLists.txt builds the library.
set(MIXTRAIN_PREBUILT_LIBRARY "" CACHE FILEPATH "Tests only: link this libmixtrain.a instead of compiling it")
if(MIXTRAIN_PREBUILT_LIBRARY)
  add_library(mixtrain STATIC IMPORTED GLOBAL)
  set_target_properties(mixtrain PROPERTIES
    IMPORTED_LOCATION ${MIXTRAIN_PREBUILT_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/include
    INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES};ZLIB::ZLIB;OpenMP::OpenMP_CXX;${CMAKE_DL_LIBS}")
  add_library(mixtrain::mixtrain ALIAS mixtrain)
endif()

# Given to llama-cpp-python's build by scripts/test (CMAKE_ARGS="-DLLAVA_BUILD=OFF
# -DCMAKE_PROJECT_INCLUDE=this file"): the package loads llama.cpp's library and ggml through ctypes, yet
# its CMakeLists forces llama.cpp's common library on (argument parsing, chat templates and their parsers:
# about a third of the compile), which only llama.cpp's own programs and the multimodal library's command
# line tools link. CMake includes this file after each project() call; after llama.cpp's own, and before
# llama.cpp reads the option, common is turned off again, so it is neither built nor installed.
if(PROJECT_NAME STREQUAL "llama.cpp" AND NOT PROJECT_IS_TOP_LEVEL)
  set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp's common library: llama-cpp-python never loads it" FORCE)
endif()

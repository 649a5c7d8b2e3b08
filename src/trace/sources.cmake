# trace/: op counting, the profiler and the Chrome-trace timeline.
target_sources(loom PRIVATE
  trace/chrome_trace.cpp
  trace/op_scope.cpp
  trace/profiler.cpp
  trace/report.cpp
  trace/roofline.cpp
)
if(LOOM_HAS_CUDA)
  target_sources(loom PRIVATE trace/cuda/gpu_info.cpp)
endif()
target_link_libraries(loom PRIVATE nlohmann_json::nlohmann_json)

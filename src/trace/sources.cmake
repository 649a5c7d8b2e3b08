# trace/: op counting, the profiler and the Chrome-trace timeline.
target_sources(loom PRIVATE
  trace/op_scope.cpp
)

// Internal: the latest error seen by each thread.
//
// While an exception unwinds the stack, destructors cannot see it
// (std::current_exception() is empty outside a catch block). loom::Context's
// destructor needs its message to tell the other ranks why this one is ending
// (NOTE [failing rank] in comm/context.cpp), so every loom::Error records its
// message here when it is made, and a Work that rethrows an error from the
// progress thread records it on the waiting thread.
#pragma once

#include <string>

namespace loom::detail {

void note_error(const std::string& message);
// The message of the latest loom::Error made (or rethrown by Work::wait) on
// this thread; empty when there was none.
const std::string& latest_error_on_this_thread();

}  // namespace loom::detail

// A peer process driven line by line over pipes (collective_bench's gloo
// peer, bench/peers/torch_collectives.py): each MPI rank starts its own, so
// the child inherits the rank's binding, and the rank blocks in read() while
// the child measures, leaving it the core.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "peer.hpp"

extern char** environ;

namespace loom::bench {

class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { kill_now(); }

  // Starts `argv` with this process's environment and the thread variables
  // set to `threads`; its stdout and stderr come back through reply().
  void start(const std::vector<std::string>& argv, int threads) {
    int to_child[2], from_child[2];
    LOOM_CHECK(pipe2(to_child, O_CLOEXEC) == 0 && pipe2(from_child, O_CLOEXEC) == 0,
               "pipe2 failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    // Not MPI's sockets and shared-memory files: the child has no use for them.
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      bool thread_variable = false;
      for (const auto& name : peer_thread_variables()) {
        thread_variable = thread_variable || entry.rfind(name + "=", 0) == 0;
      }
      if (!thread_variable) env.push_back(entry);
    }
    for (const auto& name : peer_thread_variables()) {
      env.push_back(name + "=" + std::to_string(threads));
    }
    std::vector<char*> argp, envp;
    for (const auto& a : argv) argp.push_back(const_cast<char*>(a.c_str()));
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    argp.push_back(nullptr);
    envp.push_back(nullptr);
    const int status =
        posix_spawn(&pid_, argv.at(0).c_str(), &actions, nullptr, argp.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (status != 0) {
      close(to_child[1]);
      close(from_child[0]);
      pid_ = -1;
      LOOM_CHECK(false, "cannot start ", argv.at(0), " (error ", status, ")");
    }
    // A child that died must fail a write with EPIPE, not end this rank.
    signal(SIGPIPE, SIG_IGN);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
  }

  bool running() const {
    return pid_ > 0;
  }

  void send(const std::string& line) {
    LOOM_CHECK(running() && std::fprintf(to_, "%s\n", line.c_str()) > 0 && std::fflush(to_) == 0,
               "the peer process is gone; its output:\n", noise_);
  }

  // The next line whose first word is one of `kinds`, the rest in `rest`;
  // other lines (warnings) are kept for error messages. False at end of output.
  bool reply(const std::vector<std::string>& kinds, std::string& kind, std::string& rest) {
    char* text = nullptr;
    size_t capacity = 0;
    while (running() && getline(&text, &capacity, from_) >= 0) {
      std::string line = text;
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      const std::string first = line.substr(0, line.find(' '));
      for (const auto& k : kinds) {
        if (first == k) {
          kind = k;
          rest = line.size() > first.size() ? line.substr(first.size() + 1) : "";
          free(text);
          return true;
        }
      }
      noise_.append(line).append("\n");
    }
    free(text);
    return false;
  }

  // What the child printed that was not a reply.
  const std::string& noise() const {
    return noise_;
  }

  // Waits for the child to exit (after it was told to); its exit status.
  int wait() {
    if (!running()) return -1;
    std::fclose(to_);
    std::fclose(from_);
    to_ = from_ = nullptr;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  // Ends the child at once (a failed start, an error elsewhere).
  void kill_now() {
    if (!running()) return;
    kill(pid_, SIGKILL);
    wait();
  }

 private:
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  std::string noise_;
};

}  // namespace loom::bench

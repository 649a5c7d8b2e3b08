// loom-restart: run a training job again from its newest checkpoint when it
// fails (torchrun's --max-restarts for MPI and Slurm launches).
//
//   loom-restart [--max-restarts N] [--checkpoint-dir DIR] [--resume-flag F]
//                [--no-restart-status S]... -- COMMAND...
//
//   loom-restart --max-restarts 3 -- mpirun -np 8 train_gpt --checkpoint-dir ckpt --save-every 100
//
// Runs COMMAND; when it fails (a non-zero exit or a signal: a rank killed, a
// node lost, which Loom turns into every rank stopping with the cause),
// runs it again with --resume appended (unless COMMAND has it already), so
// that the job continues from the newest complete checkpoint, at most N
// times (default 3). It does not run it again when
//  - the attempt exited with a status of --no-restart-status (default 2,
//    the status Loom's examples end with for input they refuse: a flag, a
//    layout, a checkpoint of another run; running again cannot fix it);
//  - the attempt ended because loom-restart itself was sent SIGINT, SIGTERM
//    or SIGHUP (a user or Slurm stopping the job): the signal is passed on to
//    COMMAND and loom-restart exits with its status;
//  - two attempts in a row failed without a new complete checkpoint in the
//    checkpoint directory (COMMAND's --checkpoint-dir unless given): the
//    fault is not transient (bad input, a bug), so repeating it would only
//    repeat the failure. Without a checkpoint directory only N bounds the
//    attempts.
// Exit status: 0 once an attempt succeeds; else the last attempt's status
// (128 + the signal's number when a signal ended it).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "loom/checkpoint/distributed.hpp"
#include "loom/core/error.hpp"

namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_child = 0;
volatile std::sig_atomic_t g_stop_signal = 0;

// Remembered so that the attempt it ends is not repeated, and passed on.
extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), signal);
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
}

// The attempt's exit status as a shell reports it: the code, or 128 + signal.
struct Outcome {
  int status = 0;
  std::string text;  // "exit 1", "signal 9 (Killed)"
};

Outcome run_attempt(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  LOOM_CHECK(child >= 0, "loom-restart: fork failed: ", std::strerror(errno));
  if (child == 0) {
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "loom-restart: cannot run '%s': %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = child;
  int wstatus = 0;
  while (::waitpid(child, &wstatus, 0) < 0) {
    LOOM_CHECK(errno == EINTR, "loom-restart: waitpid failed: ", std::strerror(errno));
  }
  g_child = 0;
  if (WIFSIGNALED(wstatus)) {
    const int signal = WTERMSIG(wstatus);
    return {128 + signal, loom::str_cat("signal ", signal, " (", strsignal(signal), ")")};
  }
  const int code = WEXITSTATUS(wstatus);
  return {code, loom::str_cat("exit ", code)};
}

// The value of `--checkpoint-dir X` or `--checkpoint-dir=X` in the command.
std::optional<fs::path> checkpoint_dir_of(const std::vector<std::string>& command) {
  const std::string flag = "--checkpoint-dir";
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == flag && i + 1 < command.size()) return fs::path(command[i + 1]);
    if (command[i].rfind(flag + "=", 0) == 0) return fs::path(command[i].substr(flag.size() + 1));
  }
  return std::nullopt;
}

std::string newest(const std::optional<fs::path>& dir) {
  if (!dir) return "";
  const auto latest = loom::checkpoint::latest_checkpoint(*dir);
  return latest ? latest->filename().string() : "";
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

int run(int max_restarts, std::optional<fs::path> dir, const std::string& resume_flag,
        const std::vector<int>& final_statuses, std::vector<std::string> command) {
  if (!dir) dir = checkpoint_dir_of(command);
  install_stop_handlers();
  bool stalled = false;  // the previous attempt failed without a new checkpoint
  for (int attempt = 1;; ++attempt) {
    const std::string before = newest(dir);
    std::fprintf(stderr, "loom-restart: attempt %d of %d: %s\n", attempt, max_restarts + 1,
                 joined(command).c_str());
    const auto start = std::chrono::steady_clock::now();
    const Outcome outcome = run_attempt(command);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (outcome.status == 0) {
      if (attempt > 1) std::fprintf(stderr, "loom-restart: attempt %d succeeded\n", attempt);
      return 0;
    }
    const std::string after = newest(dir);
    const bool progressed = !after.empty() && after != before;
    std::string saved =
        !dir            ? "no checkpoint directory"
        : after.empty() ? loom::str_cat("no checkpoint in ", dir->string())
        : progressed    ? loom::str_cat("newest checkpoint ", after, " (new)")
                        : loom::str_cat("newest checkpoint ", after, " (none new in this attempt)");
    std::fprintf(stderr, "loom-restart: attempt %d failed (%s) after %.1f s; %s\n", attempt,
                 outcome.text.c_str(), seconds, saved.c_str());
    if (std::find(final_statuses.begin(), final_statuses.end(), outcome.status) !=
        final_statuses.end()) {
      std::fprintf(stderr,
                   "loom-restart: exit status %d means the job refused its input "
                   "(--no-restart-status); not restarting\n",
                   outcome.status);
      return outcome.status;
    }
    if (g_stop_signal != 0) {
      std::fprintf(stderr, "loom-restart: stopped by signal %d; not restarting\n",
                   static_cast<int>(g_stop_signal));
      return outcome.status;
    }
    if (attempt > max_restarts) {
      std::fprintf(stderr, "loom-restart: %d restart(s) used up (--max-restarts); giving up\n",
                   max_restarts);
      return outcome.status;
    }
    if (dir && !progressed && stalled) {
      std::fprintf(stderr,
                   "loom-restart: two attempts in a row failed without a new checkpoint in %s; "
                   "the fault is not transient, not restarting\n",
                   dir->string().c_str());
      return outcome.status;
    }
    stalled = !progressed;
    bool has_resume = false;
    for (const std::string& arg : command) has_resume = has_resume || arg == resume_flag;
    if (!has_resume) command.push_back(resume_flag);
    std::fprintf(stderr, "loom-restart: restarting (%d of %d) with %s\n", attempt, max_restarts,
                 resume_flag.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run a training job again from its newest checkpoint when it fails"};
  int max_restarts = 3;
  std::string dir;
  std::string resume_flag = "--resume";
  std::vector<std::string> command;
  app.add_option("--max-restarts", max_restarts, "runs after the first (default 3)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", dir,
                 "where the job saves checkpoints (default: the command's --checkpoint-dir)");
  app.add_option("--resume-flag", resume_flag, "appended to the command to resume (--resume)");
  std::vector<int> final_statuses = {2};
  app.add_option("--no-restart-status", final_statuses,
                 "exit statuses not worth another attempt (default 2: input the job refuses)");
  app.add_option("command", command, "the job, after --")->required();
  app.allow_extras(false);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(max_restarts, dir.empty() ? std::nullopt : std::optional<fs::path>(dir), resume_flag,
               final_statuses, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-restart: %s\n", e.what());
    return 1;
  }
}

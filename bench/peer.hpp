// The PyTorch peers (bench/peers/*.py): where their interpreter is, how they
// are started, what their records carry, and the rule that keeps a
// comparison with them honest.
//
// The interpreter is $LOOM_PEERS_VENV/bin/python, the virtual environment
// `bash scripts/setup.sh --peers` makes (default <source>/.peers-venv; the
// benchmarks' --python overrides it). A peer starts with OMP_NUM_THREADS,
// MKL_NUM_THREADS and OPENBLAS_NUM_THREADS in its environment, since the
// thread pools read them once, when torch loads; it binds itself to the
// cores its Loom counterpart ran on and sets torch's intra- and inter-op
// threads to match.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "loom/core/error.hpp"

namespace loom::bench {

// What the benchmarks print, word for word, when the interpreter is missing;
// they then measure Loom alone.
inline constexpr const char* kPeerNotInstalled =
    "peer not installed: run `bash scripts/setup.sh --peers`";

// A side (Loom or a peer) that used more CPU than this per rank over its
// timed steps was not running one thread per rank: the comparison is refused.
inline constexpr double kMaxCoresPerRank = 1.15;

inline std::string default_peer_python(const std::string& source_dir) {
  const char* venv = std::getenv("LOOM_PEERS_VENV");
  const std::string root = venv != nullptr && *venv != '\0' ? venv : source_dir + "/.peers-venv";
  return root + "/bin/python";
}

// `python` is a path, or a command name looked up on PATH as the shell would
// (`--python python3` on a GPU machine whose own torch is the peer).
inline bool peer_installed(const std::string& python) {
  if (python.find('/') != std::string::npos) return access(python.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    const std::string dir = end > begin ? dirs.substr(begin, end - begin) : ".";
    if (access((dir + "/" + python).c_str(), X_OK) == 0) return true;
    begin = end + 1;
  }
  return false;
}

// `text` as one word for /bin/sh.
inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

inline const std::vector<std::string>& peer_thread_variables() {
  static const std::vector<std::string> names = {"OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                 "OPENBLAS_NUM_THREADS"};
  return names;
}

// "env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ": the
// start of a peer's command line.
inline std::string peer_environment(int threads) {
  std::string text = "env";
  for (const auto& name : peer_thread_variables())
    text += " " + name + "=" + std::to_string(threads);
  return text + " ";
}

// mpirun flags that pass the thread variables on to the processes it starts.
inline std::string mpirun_forward_threads() {
  std::string text;
  for (const auto& name : peer_thread_variables()) text += " -x " + name;
  return text;
}

// Throws (naming the side, the rank and the figure) when a side used more
// than kMaxCoresPerRank cores: its timings do not compare with one thread.
inline void require_one_core(const std::string& side, int rank, double share) {
  LOOM_CHECK(share <= kMaxCoresPerRank, "comparison refused: ", side, " rank ", rank, " used ",
             fixed(share, 2), " cores (CPU time / wall time of its timed steps; at most ",
             fixed(kMaxCoresPerRank, 2), " per rank compares with one thread per rank)");
}

inline void require_one_core(const std::string& side, const std::vector<double>& shares) {
  for (size_t r = 0; r < shares.size(); ++r) require_one_core(side, static_cast<int>(r), shares[r]);
}

// "0.99 1.00": per-rank figures for a table cell.
inline std::string shares_text(const std::vector<double>& shares) {
  std::string text;
  for (double s : shares) text.append(text.empty() ? "" : " ").append(fixed(s, 2));
  return text.empty() ? "-" : text;
}

// "0/1": per-rank bindings in the form the peers' --cores takes.
inline std::string bindings_text(const nlohmann::json& binding) {
  std::string text;
  for (const auto& cores : binding) {
    if (!text.empty()) text += '/';
    text += cores_text(cores.get<std::vector<int>>());
  }
  return text;
}

// "peer config: ...\n": the peer's torch.__config__ lines (BLAS, oneDNN, CPU
// capability), one line; empty when the record has none.
inline std::string peer_config_text(const nlohmann::json& peer) {
  if (!peer.contains("peer_config")) return "";
  std::string text;
  for (const auto& line : peer.at("peer_config")) {
    text.append(text.empty() ? "" : "; ").append(line.get<std::string>());
  }
  return "peer config: " + text + "\n";
}

// The fields of a peer's output every record of a comparison carries.
inline nlohmann::json peer_facts(const nlohmann::json& peer) {
  nlohmann::json facts = nlohmann::json::object();
  for (const char* key : {"peer_torch_version", "peer_config", "cpu_model", "peer_threads",
                          "peer_environment", "peer_binding", "peer_cpu_share"}) {
    if (peer.contains(key)) facts[key] = peer.at(key);
  }
  return facts;
}

// A TCP port on 127.0.0.1 free a moment ago, for a peer group's rendezvous.
inline int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  LOOM_CHECK(fd >= 0, "socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  LOOM_CHECK(ok, "no free TCP port on 127.0.0.1 for the peer's rendezvous");
  return ntohs(address.sin_port);
}

}  // namespace loom::bench

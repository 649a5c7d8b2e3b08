// loom_checkpoint_fuzz_asan CHECKPOINT_DIR WORK_DIR [CORRUPTIONS [SEED]]: the
// checkpoint reader (CheckpointReader, the manifest, the safetensors header
// parser, the records and their assembly) on every truncation and on seeded
// random corruptions of a real checkpoint. Built from the reading path's
// sources alone under ASan and UBSan (tests/checkpoint/fuzz_reader.cmake), so
// an out-of-bounds access or undefined behaviour aborts the run; here, every
// read must either succeed or throw loom::Error.
//
// The newest checkpoint in CHECKPOINT_DIR is copied to WORK_DIR/step, which
// each trial damages and reads whole (every parameter's every kind assembled):
//   - every truncation of manifest.json, and of rank-00000.safetensors every
//     length through its header, then every 97th byte; each must be refused
//     (only the manifest's trailing whitespace may go);
//   - CORRUPTIONS (default 3000) seeded random damages spread over the
//     manifest and every rank file: 1-4 random bytes anywhere, 1-4 random
//     bytes in a rank file's header, or a number in a header or the manifest
//     replaced by another (0, -1, a neighbour, a huge value) - the values a
//     parser must check; each may be read whole (a byte the format tolerates)
//     or refused.
// Exit status 0 when all is well; 1 naming each trial that failed. A
// sanitizer report aborts at once: the checkpoint it concerns is left in
// WORK_DIR/step.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <typeinfo>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/core/error.hpp"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Overwrites the file in place and cuts it to size. Not O_TRUNC: ext4 flushes
// a file truncated to zero and rewritten when it is closed (auto_da_alloc),
// which made the trials ten times slower on a disk.
void write_file(const fs::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < bytes.size();) {
    const ssize_t n =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    ok = n > 0;
    done += ok ? static_cast<size_t>(n) : 0;
  }
  ok = ok && ::ftruncate(fd, static_cast<off_t>(bytes.size())) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(2);
  }
}

enum class Outcome { read, refused, failed };

// Reads the whole checkpoint as a loading rank would. `detail` receives the
// error's text, or for a failure the exception's type and text.
Outcome read_checkpoint(const fs::path& step_dir, std::string& detail) {
  try {
    const loom::checkpoint::CheckpointReader reader(step_dir);
    for (const auto& [name, info] : reader.params()) {
      for (const std::string& kind : info.kinds) reader.assemble(name, kind);
    }
    return Outcome::read;
  } catch (const loom::Error& e) {
    detail = e.what();
    return Outcome::refused;
  } catch (const std::exception& e) {
    detail = std::string(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    detail = "an exception that is not a std::exception";
  }
  return Outcome::failed;
}

// xorshift64: the same corruptions for the same seed on every machine.
struct Random {
  uint64_t state;
  uint64_t next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

// The end of a safetensors file's header: 8 + its length, or the file's size
// when that is not plausible.
size_t header_end(const std::string& bytes) {
  uint64_t length = 0;
  if (bytes.size() >= 8) std::memcpy(&length, bytes.data(), 8);
  return bytes.size() >= 8 && length <= bytes.size() - 8 ? static_cast<size_t>(8 + length)
                                                         : bytes.size();
}

// Replaces the number (digits, with a leading '-') at a random place of
// bytes[begin, end) with another that a parser must check.
bool replace_number(std::string& bytes, size_t begin, size_t end, Random& random) {
  std::vector<size_t> starts;
  for (size_t i = begin; i < end; ++i) {
    const bool digit = bytes[i] >= '0' && bytes[i] <= '9';
    const bool after_digit = i > begin && bytes[i - 1] >= '0' && bytes[i - 1] <= '9';
    if (digit && !after_digit) starts.push_back(i);
  }
  if (starts.empty()) return false;
  const size_t at = starts[random.below(starts.size())];
  size_t stop = at;
  while (stop < end && bytes[stop] >= '0' && bytes[stop] <= '9') ++stop;
  const long long old = std::atoll(bytes.substr(at, stop - at).c_str());
  const std::string choices[] = {"0",
                                 "-1",
                                 std::to_string(old + 1),
                                 std::to_string(old - 1),
                                 std::to_string(old * 2 + 1),
                                 "9223372036854775807",
                                 "18446744073709551616",
                                 "4294967296",
                                 "1e300",
                                 "0.5"};
  bytes.replace(at, stop - at, choices[random.below(std::size(choices))]);
  return true;
}

struct Tally {
  int trials = 0, read = 0, refused = 0, failed = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR WORK_DIR [CORRUPTIONS [SEED]]\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines out before a sanitizer aborts
  const auto start = std::chrono::steady_clock::now();
  const int corruptions = argc > 3 ? std::atoi(argv[3]) : 3000;
  Random random{argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 20240615};
  const auto latest = loom::checkpoint::latest_checkpoint(argv[1]);
  if (!latest) {
    std::fprintf(stderr, "no complete checkpoint in %s\n", argv[1]);
    return 2;
  }
  const fs::path step_dir = fs::path(argv[2]) / "step";
  fs::remove_all(step_dir);
  fs::create_directories(step_dir.parent_path());
  fs::copy(*latest, step_dir, fs::copy_options::recursive);
  std::printf(
      "fuzzing the checkpoint reader on a copy of %s in %s (a sanitizer report below "
      "concerns the checkpoint left there)\n",
      latest->c_str(), step_dir.c_str());

  std::string detail;
  if (read_checkpoint(step_dir, detail) != Outcome::read) {
    std::fprintf(stderr, "the undamaged checkpoint does not read: %s\n", detail.c_str());
    return 1;
  }
  const std::vector<std::string> files = loom::checkpoint::CheckpointReader(step_dir).files();
  std::vector<std::string> originals;
  for (const std::string& name : files) originals.push_back(read_file(step_dir / name));
  const std::string manifest = read_file(step_dir / "manifest.json");

  Tally tally;
  int reported = 0;
  // Runs one trial with `name` holding `damaged`; `must_refuse`: a read is a failure.
  auto trial = [&](const std::string& name, const std::string& damaged, bool must_refuse,
                   const std::string& what) {
    write_file(step_dir / name, damaged);
    const Outcome outcome = read_checkpoint(step_dir, detail);
    ++tally.trials;
    const bool failure = outcome == Outcome::failed || (must_refuse && outcome == Outcome::read);
    if (outcome == Outcome::read) ++tally.read;
    if (outcome == Outcome::refused) ++tally.refused;
    if (failure) {
      ++tally.failed;
      if (reported++ < 20) {
        std::printf("FAIL: %s of %s: %s\n", what.c_str(), name.c_str(),
                    outcome == Outcome::read ? "read as if whole" : detail.c_str());
      }
    }
  };

  // Every truncation of the manifest (only its trailing whitespace may go).
  for (size_t length = 0; length < manifest.size(); ++length) {
    const bool only_whitespace_lost =
        manifest.find_first_not_of(" \n", length) == std::string::npos;
    trial("manifest.json", manifest.substr(0, length), !only_whitespace_lost,
          "truncation to " + std::to_string(length) + " bytes");
  }
  write_file(step_dir / "manifest.json", manifest);
  // Every truncation of the first rank file through its header, then every 97th.
  const std::string& first = originals.front();
  const size_t first_header = header_end(first);
  for (size_t length = 0; length < first.size(); length += length < first_header ? 1 : 97) {
    trial(files.front(), first.substr(0, length), true,
          "truncation to " + std::to_string(length) + " bytes");
  }
  write_file(step_dir / files.front(), first);
  const int truncations = tally.trials;

  // Seeded corruptions, round robin over the manifest and the rank files.
  for (int k = 0; k < corruptions; ++k) {
    const size_t target = static_cast<size_t>(k) % (files.size() + 1);
    const bool is_manifest = target == files.size();
    const std::string name = is_manifest ? "manifest.json" : files[target];
    const std::string& original = is_manifest ? manifest : originals[target];
    std::string bytes = original;
    const size_t header = is_manifest ? bytes.size() : header_end(bytes);
    const std::string what = "corruption #" + std::to_string(k);
    switch (random.below(3)) {
      case 0:  // random bytes anywhere
        for (size_t n = 1 + random.below(4); n > 0; --n) {
          bytes[random.below(bytes.size())] = static_cast<char>(random.next());
        }
        break;
      case 1:  // random bytes in the header (past the length for a rank file)
        for (size_t n = 1 + random.below(4); n > 0; --n) {
          const size_t from = is_manifest ? 0 : 8;
          bytes[from + random.below(header - from)] = static_cast<char>(random.next());
        }
        break;
      default:  // a number replaced: the header's length moves with it
        if (replace_number(bytes, is_manifest ? 0 : 8, header, random) && !is_manifest) {
          const uint64_t length = (header - 8) + bytes.size() - original.size();
          std::memcpy(bytes.data(), &length, 8);
        }
        break;
    }
    trial(name, bytes, false, what);
    write_file(step_dir / name, original);
  }

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%d trials (%d truncations, %d corruptions): %d read whole, %d refused with "
      "loom::Error, %d failed; %.1f s\n",
      tally.trials, truncations, tally.trials - truncations, tally.read, tally.refused,
      tally.failed, seconds);
  if (tally.failed > 0) return 1;
  if (read_checkpoint(step_dir, detail) != Outcome::read) {
    std::fprintf(stderr, "the restored checkpoint does not read: %s\n", detail.c_str());
    return 1;
  }
  fs::remove_all(step_dir);
  return 0;
}

// write_once (cstorch/data/dataset.h): a data set written by one process while the others
// wait (a barrier in a replica group, an flock on a lock file in the folder otherwise).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>

#include "cstorch/core/error.h"
#include "cstorch/data/dataset.h"
#include "cstorch/distributed.h"

namespace cstorch::data {

namespace {

// Holds an exclusive flock on `dir`/.cstorch_data.lock while alive.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("data folder '{}': cannot create it: {}", dir, ec.message());
    path_ = (std::filesystem::path(dir) / ".cstorch_data.lock").string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    // A read-only folder (a shared data set) cannot be written anyway: nothing to lock.
    if (fd_ < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) return;
    if (fd_ < 0)
      fail("data folder '{}': cannot open the lock file: {}", path_, std::strerror(errno));
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int e = errno;
      ::close(fd_);
      fail("data folder '{}': cannot lock '{}': {}", dir, path_, std::strerror(e));
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

bool write_locked(const std::string& dir, const std::function<bool()>& present,
                  const std::function<void()>& write) {
  DirLock lock(dir);
  if (present()) return false;
  write();
  return true;
}

}  // namespace

bool write_once(const std::string& dir, const std::function<bool()>& present,
                const std::function<void()>& write) {
  namespace dist = cstorch::distributed;
  const bool group = dist::is_replica() && dist::num_replicas() > 1;
  if (!group) return write_locked(dir, present, write);
  // Replica 0 first. Its error is rethrown after the barrier, so the others are not left
  // waiting; they then check (and fail) for themselves.
  bool wrote = false;
  std::exception_ptr error;
  if (dist::replica_rank() == 0) {
    try {
      wrote = write_locked(dir, present, write);
    } catch (...) {
      error = std::current_exception();
    }
  }
  dist::barrier();
  if (error) std::rethrow_exception(error);
  if (dist::replica_rank() != 0) wrote = write_locked(dir, present, write);
  return wrote;
}

}  // namespace cstorch::data

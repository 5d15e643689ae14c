#include "titan/distributed/deadline.h"

#include <chrono>

namespace titan::distributed {

Deadline::Deadline(std::string what, double seconds, Expire on_expire)
    : what_(std::move(what)), seconds_(seconds), on_expire_(std::move(on_expire)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    const auto wait = [&] { return done_; };
    if (seconds_ <= 0) cv_.wait(lock, wait);
    else cv_.wait_for(lock, std::chrono::duration<double>(seconds_), wait);
    if (done_) return;
    expired_ = true;
    lock.unlock();
    on_expire_(what_, seconds_);
  });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool Deadline::expired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expired_;
}

}  // namespace titan::distributed

// What every run shares with its front end (mixtrain/run/run_control.h): its stop, and its
// turn in the process.
#include "mixtrain/run/run_control.h"

#include "mixtrain/callbacks/stop_on_request.h"

#include <iostream>
#include <mutex>

namespace mixtrain::run {

void add_stop_callbacks(Learner& learn, const StopFlags& stop, bool keeps_checkpoints) {
  if (stop.poll && stop.requested) learn.add_cb(std::make_shared<callbacks::PollForStop>(stop.poll, stop.requested));
  if (stop.requested && !keeps_checkpoints) learn.add_cb(std::make_shared<callbacks::StopOnRequest>(stop.requested));
}

namespace {
std::mutex g_run_turn;
thread_local int g_turns_held = 0;  // this thread's nested turns
} // namespace

RunTurn::RunTurn() {
  if (g_turns_held++ > 0) return;
  if (g_run_turn.try_lock()) return;
  std::cout << "mixtrain: another run is in progress in this process; this one starts when it ends" << std::endl;
  g_run_turn.lock();
}

RunTurn::~RunTurn() {
  if (--g_turns_held == 0) g_run_turn.unlock();
}

} // namespace mixtrain::run

// Stopping a training run from the keyboard. With the handlers installed (cszoo does),
// Ctrl-C (SIGINT) or SIGTERM while Trainer::fit runs its steps ends the run at the end of the
// current step as an early stop does: a checkpoint of that step (checkpoint.save_at_end), no
// final validation, the run record's status "interrupted", and a run of the same command
// resumes from there. A second signal, or one outside a training loop, ends the process at
// once, as without the handlers. Runs of several replicas keep the default behaviour (their
// processes could not agree on the step to stop at).
#pragma once

namespace modelzoo {

// Installs the SIGINT and SIGTERM handlers for this process. A signal that was ignored when
// called (SIGINT in a shell's background job) stays ignored.
void install_interrupt_handlers();

// The signal that asked a training loop to stop (SIGINT or SIGTERM), or 0. The request stays
// for the life of the process: a later fit in it stops after its first step.
int interrupt_signal();

// After an interrupted run has been wound up: ends the process by that signal with its default
// action (the exit status a shell expects of a job stopped by Ctrl-C). Returns when there was
// none.
void exit_if_interrupted();

}  // namespace modelzoo

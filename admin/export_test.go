package admin

import "time"

// MigrateSteps are the steps of a migration, in order, as the step hook
// (SetMigrateStep) names them.
var MigrateSteps = []string{
	stepGrown, stepGrowWritten, stepClosed, stepCloseSubjects, stepMarked, stepDrained, stepFlipped,
	stepPurged, stepOpenSubjects, stepOpened, stepShrinkSubject, stepFinal,
}

// SetMigrateStep sets MigrateOptions' step test hook: it runs after each
// step, and an error stops the migration there, as a kill would.
func SetMigrateStep(o *MigrateOptions, step func(name string) error) { o.step = step }

// SetMigrateBeforeMark sets MigrateOptions' beforeMark test hook: it runs
// just before a drain marker is published into inbox stream i.
func SetMigrateBeforeMark(o *MigrateOptions, f func(stream int)) { o.beforeMark = f }

// MigrateRetrying is the message of the warning a migration logs before it
// retries a step's call that failed on a transient error.
const MigrateRetrying = retryingMsg

// SetMigrateAttemptTimeout sets how long one attempt of a call the
// migration retries on transient errors may take (default 10s).
func SetMigrateAttemptTimeout(o *MigrateOptions, d time.Duration) { o.attempt = d }

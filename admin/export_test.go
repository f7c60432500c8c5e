package admin

// MigrateSteps are the steps of a migration, in order, as the step hook
// (SetMigrateStep) names them.
var MigrateSteps = []string{
	stepGrown, stepGrowWritten, stepClosed, stepCloseSubjects, stepDrained, stepFlipped,
	stepPurged, stepOpenSubjects, stepOpened, stepShrinkSubject, stepFinal,
}

// SetMigrateStep sets MigrateOptions' step test hook: it runs after each
// step, and an error stops the migration there, as a kill would.
func SetMigrateStep(o *MigrateOptions, step func(name string) error) { o.step = step }

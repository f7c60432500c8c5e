package admin

// SetMigrateHooks sets MigrateOptions' test hooks: afterDrain runs between a
// batch's drain and its flip, afterFlip after the flip (an error stops the
// migration there, as a kill would).
func SetMigrateHooks(o *MigrateOptions, afterDrain func(round int), afterFlip func(round int) error) {
	o.afterDrain, o.afterFlip = afterDrain, afterFlip
}

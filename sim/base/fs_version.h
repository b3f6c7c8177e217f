/* fs_version.h — the one version number of flux-sim and flux-oracle.
 *
 * Both CLIs print it (--version) and flux-sim writes it into a dump's `producer`, so a report
 * can say exactly which build produced or judged a file; two constants drifted apart before. */
#ifndef FS_VERSION_H
#define FS_VERSION_H

#define FS_VERSION "0.2.0"

#endif

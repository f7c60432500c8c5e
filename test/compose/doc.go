// Package compose holds the tests of the docker compose cluster
// (compose.yaml at the repository root): three clustered NATS nodes, two
// ingresses and three workers, each a container of the one image `make
// image` builds. They run only with the build tag compose and a Docker
// engine:
//
//	make compose-test                        # builds the image, runs them
//	go test -tags compose -v ./test/compose  # the same, image already built
//
// Each run brings up its own stack under a unique compose project name
// ($COMPOSE_PROJECT_NAME followed by a random suffix when it is set), on
// free loopback ports, and removes it (containers, network, volumes) when it
// ends. COMPOSE_MESSAGES sets how many messages the chaos run posts (at
// least; default 2000), COMPOSE_LANES over how many lanes (default 40),
// COMPOSE_RATE how many a second (default 10); the fault schedule repeats
// until they are posted. COMPOSE_LOG_DIR=dir keeps every service's whole log
// (with timestamps) in dir/<project>/<service>.log when the stack is
// removed; COMPOSE_SKIP_IMAGE=1 skips the image build (make compose-test has
// built it already).
package compose

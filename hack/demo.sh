#!/usr/bin/env bash
# The newcomer's demo (make demo / make demo-down): a real single-node Kubernetes cluster on this
# machine, PostgreSQL and Apache Kafka on the host, the operator installed with Helm, the sample
# OutboxRelay applied, sample orders written through the writer library, and their events read
# back from Kafka.
#   hack/demo.sh up     set up what is missing and run the demo (leaves it running)
#   hack/demo.sh down   stop everything the demo started and restore the host
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
# Under /var/tmp, not the cache: the PostgreSQL server runs as the postgres user, which cannot
# reach root's home.
state=${OUTBOX_DEMO_DIR:-/var/tmp/outbox-operator-demo}
image=localhost/outbox-operator:dev
pg_port=54329
kafka_port=39092
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

down() {
	say "stopping the demo"
	if hack/cluster.sh status >/dev/null 2>&1; then
		eval "$(hack/cluster.sh env)"
		"$(hack/helm.sh)" uninstall outbox --namespace outbox-system >/dev/null 2>&1 || true
	fi
	hack/cluster.sh down
	hack/kafka.sh clean "$state/kafka" >/dev/null 2>&1 || true
	hack/registry.sh clean "$state/registry" >/dev/null 2>&1 || true
	hack/postgres.sh clean "$state/pg" >/dev/null 2>&1 || true
	rm -rf "$state"
	echo "demo stopped; the host is as it was"
}

up() {
	[[ $(id -u) == 0 ]] || { echo "demo.sh: the local cluster needs root (run with sudo)" >&2; exit 1; }
	local t0=$SECONDS
	say "installing what this machine lacks and building the components (cached in $cache)"
	hack/setup.sh
	mkdir -p "$state" && chmod 755 "$state"

	say "starting a single-node Kubernetes cluster"
	hack/cluster.sh status >/dev/null 2>&1 || hack/cluster.sh up
	eval "$(hack/cluster.sh env)"
	local K="hack/cluster.sh kubectl"

	say "building the operator/relay image and loading it into the node, and the kubectl outbox plugin"
	hack/build-image.sh --load "$image"
	CGO_ENABLED=0 go build -trimpath -o "$state/bin/kubectl-outbox" ./cmd/kubectl-outbox
	export PATH="$state/bin:$PATH" # kubectl finds kubectl-outbox on the PATH: `kubectl outbox`
	outbox() { echo "\$ kubectl outbox $*"; kubectl-outbox "$@"; }

	say "starting PostgreSQL and Apache Kafka on the host (at the node IP $OUTBOX_NODE_IP, as managed services)"
	PG_PORT=$pg_port PG_LISTEN="127.0.0.1,$OUTBOX_NODE_IP" hack/postgres.sh start "$state/pg" >/dev/null
	local db_url="postgres://outbox:outbox@$OUTBOX_NODE_IP:$pg_port/outbox?sslmode=disable"
	local brokers
	brokers=$(KAFKA_HOST=$OUTBOX_NODE_IP KAFKA_PORT=$kafka_port hack/kafka.sh start "$state/kafka")
	echo "PostgreSQL $db_url (password 'outbox', local demo only)"
	echo "Apache Kafka $(hack/kafka.sh version) at $brokers"

	say "helm install outbox charts/outbox-operator"
	"$(hack/helm.sh)" upgrade --install outbox charts/outbox-operator --namespace outbox-system --create-namespace \
		--set image.repository="${image%%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
		--set lagPollInterval=2s --wait --timeout 3m

	say "kubectl apply -n shop -k config/samples (database URL and brokers pointed at this machine)"
	$K create namespace shop --dry-run=client -o yaml | $K apply -f - >/dev/null
	sed -e "s|postgres://outbox:outbox@postgres.shop.svc.cluster.local:5432/shop?sslmode=disable|$db_url|" \
		-e "s|kafka.shop.svc.cluster.local:9092|$brokers|" config/samples/outbox_v1alpha1_outboxrelay.yaml |
		$K apply -n shop -f -
	$K wait -n shop --for=condition=Ready outboxrelay/orders --timeout=5m
	$K get -n shop outboxrelays -o wide
	echo "spec.publish.tracking is unset: the operator resolved it from the table (a new one: Snapshot):"
	$K get -n shop events --field-selector reason=TrackingResolved -o jsonpath='{range .items[*]}  {.note}{.message}{"\n"}{end}' 2>/dev/null || true

	say "an application writes 2,000 orders, each with OrderCreated and OrderPlaced in the same transaction"
	DATABASE_URL=$db_url go run ./examples/orders -n 2000 -customers 50

	say "watching the relays drain the outbox (kubectl get outboxrelays)"
	for _ in $(seq 1 60); do
		$K get -n shop outboxrelays --no-headers
		[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.pendingEvents}') == 0 ]] && break
		sleep 2
	done
	$K get -n shop outboxrelays -o wide

	say "a few events as Kafka has them (kcat, an independent consumer)"
	kcat -b "$brokers" -C -t orders.events -o beginning -c 3 -e -f 'partition %p offset %o key %k headers %h\n  %s\n'
	kcat -b "$brokers" -C -t customers.events -o beginning -c 2 -e -f 'partition %p offset %o key %k headers %h\n  %s\n'

	say "kubectl scale outboxrelay/orders --replicas=3 while the application writes: a safe reshard, no pod restarts"
	$K scale -n shop outboxrelay/orders --replicas=3
	DATABASE_URL=$db_url go run ./examples/orders -n 1000 -customers 50
	for _ in $(seq 1 60); do
		[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.lastReshard.toShards}/{.status.lastReshard.pauseMilliseconds}') == 3/[0-9]* ]] && break
		sleep 1
	done
	$K get -n shop outboxrelay orders -o jsonpath='status.shards={.status.shards} lastReshard={.status.lastReshard}{"\n"}'
	$K get -n shop events --field-selector involvedObject.name=orders --sort-by=.lastTimestamp 2>/dev/null | grep -E 'Reshard|SwitchedLayout' | tail -3 || true
	echo "a node drain takes the relay pods one at a time (the operator's PodDisruptionBudget, at most one unavailable):"
	$K get -n shop poddisruptionbudget orders-relays 2>&1 | sed 's/^/  /'

	say "snapshot tracking (the default): no event row is marked sent, the relays keep one cursor per shard"
	for _ in $(seq 1 60); do
		$K exec -n shop deploy/orders-shard-0 -- /relay cursor --log-format text 2>/dev/null | grep -q "tracked by snapshot" &&
			[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.pendingEvents}') == 0 ]] && break
		sleep 2
	done
	$K exec -n shop deploy/orders-shard-0 -- /relay cursor --log-format text 2>/dev/null
	psql "$db_url" -qAtc "SELECT count(*) || ' events, ' || count(sent_at) || ' marked sent' FROM outbox" | sed 's/^/  /'
	echo "going back to Row is refused: the relays keep Snapshot, and the operator says why:"
	$K patch -n shop outboxrelay/orders --type=merge -p '{"spec":{"publish":{"tracking":"Row"}}}' 2>&1 | sed 's/^/  /' || true
	for _ in $(seq 1 30); do
		$K get -n shop events --field-selector reason=TrackingCannotGoBack -o name 2>/dev/null | grep -q . && break
		sleep 1
	done
	$K get -n shop events --field-selector reason=TrackingCannotGoBack -o jsonpath='{range .items[*]}  {.note}{.message}{"\n"}{end}' 2>/dev/null || true
	$K get -n shop outboxrelay orders -o jsonpath='  status.tracking={.status.tracking}{"\n"}'
	$K patch -n shop outboxrelay/orders --type=json -p '[{"op":"remove","path":"/spec/publish/tracking"}]' 2>&1 | sed 's/^/  /' || true

	echo "row tracking's pending index is dropped (one index entry less per insert):"
	for _ in $(seq 1 60); do
		$K exec -n shop deploy/orders-shard-0 -- /relay indexes --log-format text 2>/dev/null | grep -q "no pending index" && break
		sleep 2
	done
	$K exec -n shop deploy/orders-shard-0 -- /relay indexes --log-format text 2>/dev/null | sed 's/^/  /'

	say "any language appends with one statement, the table's SQL append (it takes the aggregate's lock, as outbox.Append does): here psql"
	sql_id=$(psql "$db_url" -qAtc "SELECT outbox_append('order', 'order-from-sql', 'OrderPlaced', '{\"written_by\": \"psql\"}'::jsonb)")
	echo "  appended event $sql_id; an independent consumer (kcat) reads it from orders.events:"
	for _ in $(seq 1 30); do
		kcat -b "$brokers" -C -t orders.events -o beginning -e -q -f 'key %k headers %h\n  %s\n' 2>/dev/null | grep -A1 "$sql_id" && break
		sleep 1
	done

	say "routing, keys, compression and topics: invoice events go to billing.invoices, which the operator creates (spec.kafka.topics: Create, 3 partitions); an event's own headers name its topic and its key; batches are lz4, events CloudEvents (binary mode), a bytes payload and a tombstone"
	$K patch -n shop outboxrelay/orders --type=merge -p '{"spec":{"topics":{"invoice":"billing.invoices"},"routing":{"topicHeader":"destination","keyHeader":"entity"},"publish":{"compression":"Lz4","cloudEvents":{"mode":"Binary"},"nullPayload":"Tombstone"},"kafka":{"topics":{"policy":"Create","partitions":3}}}}'
	$K wait -n shop --for=condition=TopicsReady outboxrelay/orders --timeout=2m
	$K get -n shop outboxrelay orders -o jsonpath='  TopicsReady: {.status.conditions[?(@.type=="TopicsReady")].message}{"\n"}'
	$K get -n shop events --field-selector reason=TopicCreated -o jsonpath='{range .items[*]}  {.note}{.message}{"\n"}{end}' 2>/dev/null || true
	for d in $($K get -n shop deploy -o name | grep '/orders-shard-'); do
		$K rollout status -n shop "$d" --timeout=2m >/dev/null
	done
	psql "$db_url" -qAtc "SELECT outbox_append('invoice', 'inv-1', 'InvoiceIssued', '{\"total\": 42}'::jsonb)" >/dev/null
	psql "$db_url" -qAtc "SELECT outbox_append('order', 'order-7', 'OrderShipped', '{\"carrier\": \"dhl\"}'::jsonb, '{\"destination\": \"eu.shipments\", \"entity\": \"customer-7\"}'::jsonb)" >/dev/null
	psql "$db_url" -qAtc "SELECT outbox_append_bytes('invoice', 'inv-1', 'InvoiceEncoded', '\\x0a02ff00'::bytea, '{\"content-type\": \"application/x-protobuf\"}'::jsonb)" >/dev/null
	psql "$db_url" -qAtc "SELECT outbox_append_bytes('invoice', 'inv-1', 'InvoiceDeleted', NULL)" >/dev/null
	echo "  an independent consumer (kcat) reads each where it was routed:"
	for t in billing.invoices eu.shipments; do
		for _ in $(seq 1 60); do
			kcat -b "$brokers" -C -t "$t" -o beginning -c 1 -e -q -f "  $t partition %p key %k headers %h\n" 2>/dev/null | grep . && break
			sleep 1
		done
	done
	echo "  inv-1's bytes payload (its length) and tombstone (a null value: length -1):"
	for _ in $(seq 1 60); do
		[[ $(kcat -b "$brokers" -C -t billing.invoices -o beginning -e -q -f '%k\n' 2>/dev/null | grep -c inv-1) -ge 3 ]] && break
		sleep 1
	done
	kcat -b "$brokers" -C -t billing.invoices -o beginning -e -q -f '  key %k value length %S ce_type %h\n' 2>/dev/null | sed 's/ce_type .*ce_type=\([A-Za-z]*\).*/ce_type \1/'


	say "Schema Registry framing: a signups table published in the registry's wire format (JSON Schema, registered by the relays from a ConfigMap, every payload validated); Apicurio Registry runs on the host"
	local registry
	registry=$(REGISTRY_HOST=$OUTBOX_NODE_IP REGISTRY_PORT=38081 hack/registry.sh start "$state/registry")
	echo "  Apicurio Registry $(hack/registry.sh version) at $registry"
	$K create configmap -n shop signup-schemas --from-literal=UserSignedUp.json='{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}' \
		--dry-run=client -o yaml | $K apply -f - >/dev/null
	$K apply -n shop -f - <<-YAML
	apiVersion: outbox.dev/v1alpha1
	kind: OutboxRelay
	metadata:
	  name: signups
	spec:
	  database: {secretRef: {name: shop-db, key: url}, table: signup_outbox}
	  kafka: {brokers: ["$brokers"]}
	  defaultTopic: signups.events
	  shards: 1
	  poisonEvents: {policy: DeadLetter, deadLetterTopic: signups.dlq}
	  publish:
	    schemaRegistry:
	      url: $registry
	      format: JSON
	      subjectStrategy: RecordName
	      validation: Enforce
	      schemasConfigMapRef: {name: signup-schemas}
	YAML
	$K wait -n shop --for=condition=Ready outboxrelay/signups --timeout=3m
	psql "$db_url" -qAtc "SELECT signup_outbox_append('user', 'user-1', 'UserSignedUp', '{\"email\": \"ada@example.com\"}'::jsonb)" >/dev/null
	psql "$db_url" -qAtc "SELECT signup_outbox_append('user', 'user-2', 'UserSignedUp', '{\"name\": \"no email\"}'::jsonb)" >/dev/null
	for _ in $(seq 1 60); do
		kcat -b "$brokers" -C -t signups.events -o beginning -c 1 -e -q -f '.' 2>/dev/null | grep -q . && break
		sleep 1
	done
	echo "  the registry holds subject $(curl -fsS "$registry/subjects" 2>/dev/null), registered by the relay; user-1's value on signups.events, its first bytes the magic byte and the schema id:"
	kcat -b "$brokers" -C -t signups.events -o beginning -c 1 -e -q -f '%s' 2>/dev/null | od -A n -t x1 -N 5 | sed 's/^/   /'
	kcat -b "$brokers" -C -t signups.events -o beginning -c 1 -e -q -f '%s\n' 2>/dev/null | cut -c6- | sed 's/^/    then the payload: /'
	for _ in $(seq 1 60); do
		kcat -b "$brokers" -C -t signups.dlq -o beginning -c 1 -e -q -f '.' 2>/dev/null | grep -q . && break
		sleep 1
	done
	echo "  user-2's payload does not fit the schema: dead-lettered, with why (signups.dlq):"
	kcat -b "$brokers" -C -t signups.dlq -o beginning -c 1 -e -q -f '  key %k value %s\n  headers %h\n' 2>/dev/null | sed 's/event_id=[^,]*,//'

	say "spec.writers.checks unset: a table the operator makes has no CHECKs (each insert is cheaper); the SQL append still refuses an empty event type, a plain INSERT of one is accepted, and the relay refuses it instead (poison, reason invalid: dead-lettered here)"
	echo "  signup_outbox_checks() = $(psql "$db_url" -qAtc "SELECT signup_outbox_checks()") (the operator's event: $($K get events -n shop --field-selector reason=ChecksChanged,involvedObject.name=signups -o jsonpath='{.items[-1:].message}'))"
	echo "  SELECT signup_outbox_append('user', 'user-3', '', ...):"
	{ psql "$db_url" -qAtc "SELECT signup_outbox_append('user', 'user-3', '', '{\"email\": \"grace@example.com\"}')" 2>&1 || true; } | sed 's/^/    /'
	psql "$db_url" -qAtc "INSERT INTO signup_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('user', 'user-3', '', '{\"email\": \"grace@example.com\"}')" >/dev/null
	for _ in $(seq 1 60); do
		[[ $(kcat -b "$brokers" -C -t signups.dlq -o beginning -e -q -f '.\n' 2>/dev/null | grep -c .) -ge 2 ]] && break
		sleep 1
	done
	echo "  user-3's event on signups.dlq, with why:"
	kcat -b "$brokers" -C -t signups.dlq -o beginning -e -q -f '  key %k headers %h\n' 2>/dev/null | grep 'key user-3' | sed 's/event_id=[^,]*,//; s/ headers /\n  headers /'

	say "exactly-once delivery: a ledger relay publishes each batch with its cursor in one Kafka transaction; its pod is killed mid-stream and a read_committed consumer (kcat) still reads every event once"
	$K apply -n shop -f - <<-YAML
	apiVersion: outbox.dev/v1alpha1
	kind: OutboxRelay
	metadata:
	  name: ledger
	spec:
	  database: {secretRef: {name: shop-db, key: url}, table: ledger_outbox}
	  kafka: {brokers: ["$brokers"], topics: {policy: Create, partitions: 3}}
	  defaultTopic: ledger.events
	  shards: 1
	  publish: {tracking: Snapshot, delivery: ExactlyOnce, cursorTopic: ledger.cursors}
	YAML
	$K wait -n shop --for=condition=Ready outboxrelay/ledger --timeout=3m
	psql "$db_url" -qAtc "SELECT ledger_outbox_append('account', 'acct-0', 'Opened', '{}'::jsonb)" >/dev/null
	for _ in $(seq 1 120); do # the relay publishes: its first transaction committed
		[[ $(kcat -b "$brokers" -C -t ledger.events -o beginning -e -q -f '.\n' 2>/dev/null | wc -l) -ge 1 ]] && break
		sleep 0.5
	done
	( for t in $(seq 1 120); do
		psql "$db_url" -qAtc "SELECT count(ledger_outbox_append('account', 'acct-' || (i % 7), 'Posted', jsonb_build_object('tx', $t, 'i', i))) FROM generate_series(1, 50) AS i" >/dev/null
		sleep 0.2
	done ) &
	local writer=$! total=6001 seen=0 writing="the writers still writing"
	for _ in $(seq 1 120); do
		# read_uncommitted: a read_committed reader reaches the end only once no transaction is open
		seen=$(kcat -b "$brokers" -X isolation.level=read_uncommitted -C -t ledger.events -o beginning -e -q -f '.\n' 2>/dev/null | wc -l)
		[[ $seen -ge 300 ]] && break
		sleep 0.5
	done
	kill -0 "$writer" 2>/dev/null || writing="the writers done"
	echo "  $seen of $total events in the log, $writing; killing the relay's pod (no grace):"
	$K delete pod -n shop -l app.kubernetes.io/instance=ledger --grace-period=0 --force 2>&1 | grep -v "^Warning" | sed 's/^/  /'
	wait "$writer"
	for _ in $(seq 1 120); do
		[[ $(kcat -b "$brokers" -C -t ledger.events -o beginning -e -q -f '.\n' 2>/dev/null | wc -l) -ge $total ]] && break
		sleep 1
	done
	local read dups
	read=$(kcat -b "$brokers" -X isolation.level=read_committed -C -t ledger.events -o beginning -e -q -f '%h\n' 2>/dev/null | grep -o 'event_id=[^,]*' | wc -l)
	dups=$(kcat -b "$brokers" -X isolation.level=read_committed -C -t ledger.events -o beginning -e -q -f '%h\n' 2>/dev/null | grep -o 'event_id=[^,]*' | sort | uniq -d | wc -l)
	echo "  $total events written; read_committed: $read records, $dups event ids twice; the shard's cursor record on ledger.cursors:"
	kcat -b "$brokers" -X isolation.level=read_committed -C -t ledger.cursors -o beginning -e -q -f '  key %k\n  value %s\n' 2>/dev/null | tail -2 |
		sed 's/"buckets":\[0,[0-9,]*255\]/"buckets":[0,...,255]/g'

	say "a poison event parked and retried (snapshot tracking): the broker refuses a payment event (its topic now takes at most 1 KB)"
	go run ./hack/topicconfig -brokers "$brokers" -topic shop.events -set max.message.bytes=1024
	psql "$db_url" -qc "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
		('payment', 'pay-1', 'PaymentCaptured', jsonb_build_object('receipt', repeat('x', 4000))),
		('payment', 'pay-1', 'PaymentRefunded', '{\"amount\": 5}')"
	echo "the relay parks it, with the later event of its aggregate, retries it with backoff and goes on with the others:"
	for _ in $(seq 1 60); do
		[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.parkedEvents}') -ge 2 ]] && break
		sleep 1
	done
	$K get -n shop outboxrelays -o wide
	echo "day-2 commands (kubectl outbox, the plugin: it reads the database URL from the Secret with your own RBAC):"
	outbox status orders -n shop
	outbox events orders -n shop --aggregate pay-1
	echo "the topic's limit raised; retry now instead of waiting for the backoff: both are published, in order"
	go run ./hack/topicconfig -brokers "$brokers" -topic shop.events -set max.message.bytes=1048576
	outbox retry orders -n shop --aggregate pay-1
	for _ in $(seq 1 90); do
		[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.parkedEvents}') == 0 ]] && break
		sleep 1
	done
	$K get -n shop outboxrelays -o wide
	kcat -b "$brokers" -C -t shop.events -o beginning -e -f 'offset %o key %k %h\n' | grep pay-1 | sed 's/,aggregate_type.*//'
	local first
	first=$(psql "$db_url" -Atc "SELECT event_id FROM outbox WHERE aggregate_id = 'pay-1' ORDER BY id LIMIT 1")
	outbox published orders -n shop --event "$first"

	say "a consumer lost its state: replay pay-1's events (a relay publishes the copies, with their event_id, throttled)"
	outbox replay orders -n shop --from "$first" --aggregate pay-1 --dry-run
	outbox replay orders -n shop --from "$first" --aggregate pay-1 --rate 100 --reason "demo: the payments consumer lost its state"
	for _ in $(seq 1 60); do
		kubectl-outbox replay orders -n shop --list -o json | grep -q '"state": "done"' && break
		sleep 1
	done
	outbox replay orders -n shop --list
	kcat -b "$brokers" -C -t shop.events -o beginning -e -f 'offset %o key %k %h\n' | grep pay-1 | sed 's/,aggregate_type.*//'

	say "wake-ups: by default the relays poll every 10 ms, backing off while idle to one poll every 5 s (publish.idlePollInterval; an event after a quiet spell waits at most a sixteenth of it), and the table has no insert trigger (the application's inserts pay nothing for wake-ups); publish.notify=true creates it (an idle relay woken in ~1 ms, at a cost to every insert), false drops it again"
	set_notify() { # true|false: patch spec.publish.notify and wait for the operator to match the trigger
		$K patch -n shop outboxrelay/orders --type=merge -p "{\"spec\":{\"publish\":{\"notify\":$1}}}"
		for _ in $(seq 1 60); do
			[[ $(psql "$db_url" -Atc "SELECT outbox_notifies()") == "${1:0:1}" ]] && break
			sleep 1
		done
		psql "$db_url" -Atc "SELECT 'insert trigger: ' || outbox_notifies()"
	}
	psql "$db_url" -Atc "SELECT 'insert trigger: ' || outbox_notifies()"
	set_notify true
	set_notify false
	$K get -n shop events --field-selector involvedObject.name=orders --sort-by=.lastTimestamp 2>/dev/null | grep -E 'Wakeups' | tail -1 || true
	DATABASE_URL=$db_url go run ./examples/orders -n 200 -customers 50
	for _ in $(seq 1 90); do
		$K rollout status -n shop deploy/orders-shard-0 --timeout=1s >/dev/null 2>&1 &&
			[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.pendingEvents}') == 0 ]] && break
		sleep 2
	done
	$K exec -n shop deploy/orders-shard-0 -- /relay wakeups --log-format text 2>/dev/null
	$K get -n shop outboxrelays

	say "the broker goes away: the relays stop, say why (RelaysAvailable: KafkaUnreachable) and charge no event; back, they resume by themselves"
	KAFKA_HOST=$OUTBOX_NODE_IP KAFKA_PORT=$kafka_port hack/kafka.sh stop "$state/kafka" >/dev/null
	DATABASE_URL=$db_url go run ./examples/orders -n 100 -customers 20
	relays_available() {
		$K get -n shop outboxrelay orders -o jsonpath='{range .status.conditions[?(@.type=="RelaysAvailable")]}{.status} {.reason}{end}'
	}
	for _ in $(seq 1 120); do
		[[ $(relays_available) == "False KafkaUnreachable" ]] && break
		sleep 1
	done
	$K get -n shop outboxrelay orders -o jsonpath='{range .status.conditions[?(@.type=="RelaysAvailable")]}RelaysAvailable={.status} {.reason}: {.message}{"\n"}{end}'
	echo "events waiting: $(psql "$db_url" -Atc "SELECT outbox_pending()"); charged for the outage (parked): $(psql "$db_url" -Atc "SELECT count(*) FROM outbox_parked")"
	KAFKA_HOST=$OUTBOX_NODE_IP KAFKA_PORT=$kafka_port hack/kafka.sh start "$state/kafka" >/dev/null
	for _ in $(seq 1 120); do
		[[ $(relays_available) == "True RelaysAvailable" ]] &&
			[[ $($K get -n shop outboxrelay orders -o jsonpath='{.status.pendingEvents}') == 0 ]] && break
		sleep 1
	done
	$K get -n shop outboxrelays

	say "deleting an OutboxRelay under spec.deletion.policy: Drain: its relays publish what is pending before they go"
	$K apply -n shop -f - <<-YAML
	apiVersion: outbox.dev/v1alpha1
	kind: OutboxRelay
	metadata:
	  name: audit
	spec:
	  database: {secretRef: {name: shop-db, key: url}, table: audit_outbox}
	  kafka: {brokers: ["$brokers"]}
	  defaultTopic: audit.events
	  shards: 1
	  deletion: {policy: Drain, drainTimeout: 2m}
	YAML
	$K wait -n shop --for=condition=Ready outboxrelay/audit --timeout=3m
	echo "  20,000 audit events committed, and the OutboxRelay deleted at once:"
	psql "$db_url" -qc "INSERT INTO audit_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'audit', 'user-' || (g % 100), 'LoggedIn', jsonb_build_object('n', g) FROM generate_series(1, 20000) AS g"
	$K delete -n shop outboxrelay/audit --wait=false | sed 's/^/  /'
	$K wait -n shop --for=delete outboxrelay/audit --timeout=3m
	$K get -n shop events --field-selector reason=Drained -o jsonpath='{range .items[*]}  {.note}{.message}{"\n"}{end}' 2>/dev/null || true
	echo "  audit.events holds $(kcat -b "$brokers" -C -t audit.events -o beginning -e -q -f '%o\n' | wc -l) records (an independent consumer)"

	say "least privilege: relay grants prints the SQL that gives the relays and the writers their own roles, with only what they need (docs/privileges.md; spec.relay.databaseSecretRef runs the relays as theirs)"
	$K exec -n shop deploy/orders-shard-0 -- /relay grants --table public.outbox --owner-role outbox \
		--relay-role outbox_relay --writer-role shop_app 2>/dev/null | grep -E '^(GRANT|CREATE|REVOKE)' | sed -n '1,12p'
	echo "..."

	say "the demo is running ($((SECONDS - t0))s)"
	cat <<MSG
  kubectl:   hack/cluster.sh kubectl get -n shop outboxrelays,deployments,pods
  scale:     hack/cluster.sh kubectl scale -n shop outboxrelay/orders --replicas=1
  more:      DATABASE_URL='$db_url' go run ./examples/orders -n 10000
  consume:   kcat -b $brokers -C -t orders.events
  stop:      make demo-down
MSG
}

case ${1:-} in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

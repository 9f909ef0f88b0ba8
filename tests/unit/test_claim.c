/* test_claim.c - unit tests for claim.c's statement builders and its text[]
 * parser (no database: the SQL itself is tested by the integration tests). */
#include <stdlib.h>
#include <string.h>

#include "claim.h"
#include "tap.h"

/* Every statement slot the builder may use starts dirty, so a field the
 * builder forgets to set shows up (a stack array is not zeroed either). */
static void dirty(struct db_stmt *st, int n)
{
	memset(st, 0x5a, (size_t)n * sizeof(*st));
}

static void test_finish(void)
{
	struct db_stmt st[CLAIM_FINISH_MAX];
	struct finish_params p;
	struct claim_outcome ok_out = {
	    .status = CLAIM_SUCCEEDED, .result = "{}", .entry = "{\"reason\": \"none\"}"};
	dirty(st, CLAIM_FINISH_MAX);
	int n = claim_build_finish(st, &p, 42, 31, &ok_out);
	is_int(n, 2, "succeeded: UPDATE and COMMIT");
	is_int(st[0].nparams, 8, "the UPDATE has 8 parameters");
	is_str(st[0].params[6], "31", "... the fencing token");
	is_str(st[0].params[7], "{\"reason\": \"none\"}", "... the history entry last");
	is_str(st[0].params[0], "42", "... the job id first");
	is_str(st[0].params[1], "succeeded", "... then the status");
	ok(st[0].params[3] == NULL, "... no error: SQL NULL");
	is_str(st[1].sql, "COMMIT", "then COMMIT");
	is_int(st[1].nparams, 0, "COMMIT has no parameters");

	struct claim_outcome c = {.status = CLAIM_CANCELLED,
				  .error = "{\"reason\": \"cancelled\"}"};
	dirty(st, CLAIM_FINISH_MAX);
	n = claim_build_finish(st, &p, 7, 1, &c);
	is_int(n, 3, "cancelled: UPDATE, drop the cancel request, COMMIT");
	ok(strstr(st[1].sql, "cancel_requests") != NULL, "the second drops the cancel request");
	is_int(st[1].nparams, 1, "... by job id");
	is_str(st[1].params[0], "7", "... 7");
	is_str(st[2].sql, "COMMIT", "then COMMIT");
	is_int(st[2].nparams, 0, "COMMIT has no parameters (regression: it had garbage)");
	ok(!st[2].sync, "... and no stray sync flag");

	struct claim_outcome r = {.status = CLAIM_QUEUED, .retry_in_ms = 1500, .give_back = true};
	n = claim_build_finish(st, &p, 9, 1, &r);
	is_int(n, 2, "queued: UPDATE and COMMIT");
	is_str(st[0].params[4], "1500", "retry delay in ms");
	is_str(st[0].params[5], "1", "give_back 1");
	ok(st[0].params[7] == NULL, "no history entry: SQL NULL");
}

static void test_maintain(void)
{
	struct db_stmt st[2];
	struct maintain_params p;
	buf_init(&p.queues);
	buf_init(&p.retention);
	const char *queues[] = {"a", "b\"c"};
	long long ret[] = {604800000, 0};
	dirty(st, 2);
	int n = claim_build_maintain(st, &p, queues, ret, 2, 500, 3000, true);
	is_int(n, 2, "maintenance: maintain() and the cancel requests");
	is_int(st[0].nparams, 4, "maintain() has 4 parameters");
	is_str(st[0].params[0], "{\"a\",\"b\\\"c\"}", "queues as a quoted text[] literal");
	is_str(st[0].params[1], "{604800000,0}", "retention in ms as a bigint[] literal");
	is_str(st[0].params[2], "500", "the batch bound");
	is_str(st[0].params[3], "3000", "how long the pace is kept");
	is_int(st[CLAIM_MAINTAIN_CANCELS].nparams, 0, "the cancel requests need no parameter");
	n = claim_build_maintain(st, &p, queues, ret, 0, 10, 3000, false);
	is_int(n, 1, "no job running: maintain() alone");
	is_str(st[0].params[0], "{}", "... an empty text[]");
	is_str(st[0].params[1], "{}", "... an empty bigint[]");
	buf_fini(&p.queues);
	buf_fini(&p.retention);
}

/* Lock mode lease: the claim's lease parameter, the extension, and the
 * outcomes' JSON array. */
static void test_lease(void)
{
	struct db_stmt st;
	struct claim_params cp;
	claim_params_init(&cp);
	const char *workers[] = {"h:1:q.0", "h:1:q.1"};
	long long skip[] = {5};
	struct claim_req r = {.queue = "q",
			      .worker_id = 3,
			      .workers = workers,
			      .nworkers = 2,
			      .max_attempts = 5,
			      .skip = skip,
			      .nskip = 1};
	dirty(&st, 1);
	claim_build(&st, &cp, &r);
	is_int(st.nparams, 10, "claim: 10 parameters");
	ok(st.params[9] == NULL, "... transaction mode: no lease (SQL NULL)");
	is_str(st.params[8], "{5}", "... the skip list");
	r.lease_ms = 30000;
	claim_build(&st, &cp, &r);
	is_str(st.params[9], "30000", "... lease mode: the lease in ms");
	claim_params_fini(&cp);

	struct extend_params ep;
	buf_init(&ep.ids);
	buf_init(&ep.fences);
	long long ids[] = {7, 9}, fences[] = {70, 90};
	dirty(&st, 1);
	is_int(claim_build_extend(&st, &ep, 4, ids, fences, 2), 1, "extension: one statement");
	is_int(st.nparams, 3, "... 3 parameters");
	is_str(st.params[0], "4", "... the instance");
	is_str(st.params[1], "{7,9}", "... the ids");
	is_str(st.params[2], "{70,90}", "... their fencing tokens, in the same order");
	ok(!st.sync, "... no stray sync flag");
	buf_fini(&ep.ids);
	buf_fini(&ep.fences);

	struct buf b;
	buf_init(&b);
	struct claim_outcome ok_out = {.status = CLAIM_SUCCEEDED, .result = "{\"a\": [1, \"x\"]}"};
	struct claim_outcome q = {.status = CLAIM_QUEUED,
				  .error = "{\"reason\": \"exit\"}",
				  .retry_in_ms = 1500,
				  .give_back = true,
				  .entry = "{\"reason\": \"exit\", \"cpu_ms\": 12}"};
	buf_putc(&b, '[');
	claim_outcome_json(&b, 42, 31, &ok_out);
	buf_putc(&b, ',');
	claim_outcome_json(&b, 43, 32, &q);
	buf_putc(&b, ']');
	is_str(b.data,
	       "[{\"id\": 42, \"fence\": 31, \"status\": \"succeeded\", \"retry_ms\": 0, "
	       "\"give_back\": false, \"result\": {\"a\": [1, \"x\"]}, \"error\": null, "
	       "\"entry\": null},"
	       "{\"id\": 43, \"fence\": 32, \"status\": \"queued\", \"retry_ms\": 1500, "
	       "\"give_back\": true, \"result\": null, \"error\": {\"reason\": \"exit\"}, "
	       "\"entry\": {\"reason\": \"exit\", \"cpu_ms\": 12}}]",
	       "outcomes: one JSON array, result, error and history entry embedded as JSON");
	dirty(&st, 1);
	is_int(claim_build_finish_leases(&st, b.data), 1, "outcomes: one statement");
	ok(st.nparams == 1 && st.params[0] == b.data, "... the array as its one parameter");
	buf_fini(&b);
}

static void test_text_array(void)
{
	char **v;
	is_int(claim_parse_text_array("{}", &v), 0, "empty array");
	util_strv_free(v);
	int n = claim_parse_text_array("{a,\"b c\",NULL,\"NULL\",\"q\\\"x\"}", &v);
	is_int(n, 5, "five elements");
	if (n == 5) {
		is_str(v[0], "a", "plain");
		is_str(v[1], "b c", "quoted with a space");
		is_str(v[2], "", "NULL becomes empty");
		is_str(v[3], "NULL", "a quoted \"NULL\" is text");
		is_str(v[4], "q\"x", "an escaped quote");
		ok(v[5] == NULL, "NULL-terminated");
	}
	util_strv_free(v);
	is_int(claim_parse_text_array("{a", &v), -1, "unterminated: -1");
	is_int(claim_parse_text_array("a}", &v), -1, "no brace: -1");
	is_int(claim_parse_text_array("{\"a}", &v), -1, "unterminated quote: -1");
}

/* claim_recheck: once more only for the claim that registered the claimer. */
static void test_recheck(void)
{
	bool w = false;
	ok(claim_recheck(&w, 4, 1) && w, "a new session's claim that leaves slots idle: once more");
	ok(!claim_recheck(&w, 4, 0) && w, "already registered: not again");
	ok(!claim_recheck(&w, 4, 4) && !w, "a full claim takes the registration off");
	ok(!claim_recheck(&w, 4, 4) && !w, "... and stays off while claims are full");
	ok(claim_recheck(&w, 4, 3) && w, "idle again after full ones: once more");
	ok(!claim_recheck(&w, 0, 0) && w, "a claim that asked for nothing changes nothing");
	w = false;
	ok(!claim_recheck(&w, 0, 0) && !w, "... also unregistered");
}

int main(void)
{
	test_finish();
	test_recheck();
	test_maintain();
	test_lease();
	test_text_array();
	return tap_done();
}

/* claim-sql - prints the statement the daemon claims with (claim_sql_claim),
 * so that t_44_claim_paths.sh and t_45_backlog.sh prepare and run the very
 * statement the program sends, not a copy of its source text. */
#include <stdio.h>

#include "claim.h"

int main(void)
{
	if (puts(claim_sql_claim) == EOF)
		return 1;
	return fflush(stdout) == 0 ? 0 : 1;
}

local ADDON, ns = ...
ns.L = {
	LEDGER_TITLE = "Quest Ledger",
	PARTY_PROGRESS = "Party progress",
	MIGRATED = "QuestLedger: profile upgraded to schema %d",
}
